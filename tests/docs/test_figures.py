"""A figure the docs quote from a measurement is the measurement's own: a decimal in a paragraph
that cites a benchmark (benchmarks/results/X.md, benchmarks/X.py, benchmarks/README.md) appears in
those results, so a rerun benchmark cannot leave a stale second copy unnoticed; the activation
figures quoted from `framework plan` are what it prints."""
from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT
from tests.helpers.in_process import run_command

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def cited_results(paragraph: str) -> list:
    files = {ROOT / c for c in re.findall(r"benchmarks/results/[\w.-]+\.md", paragraph)}
    for script in re.findall(r"benchmarks/(\w+)\.py", paragraph):
        files |= set((ROOT / "benchmarks" / "results").glob(f"{script}*.md"))
    if "benchmarks/README.md" in paragraph:
        files.add(ROOT / "benchmarks" / "README.md")
    return sorted(f for f in files if f.is_file())


def paragraphs(page) -> list[str]:
    return re.split(r"\n\s*\n", re.sub(r"^```.*?^```$", "", page.read_text(), flags=re.S | re.M))


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_a_figure_quoted_from_a_benchmark_is_in_its_results(page):
    stale = []
    for paragraph in paragraphs(page):
        files = cited_results(paragraph)
        results = " ".join(f.read_text() for f in files)
        if "framework plan" in paragraph and "activation share" in paragraph:
            continue  # figures `framework plan` prints: checked below
        stale += [f"{figure} ({', '.join(f.name for f in files)})" for figure in
                  re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", paragraph) if files and figure not in results]
    assert not stale, f"{page.relative_to(ROOT)}: figures not in the results they cite: {stale}"


def test_the_context_parallel_activation_figures_are_what_plan_prints(tmp_path):
    text = (ROOT / "docs" / "strategies.md").read_text()
    quoted = re.search(r"32768 tokens of the default GPT, ([\d.]+), ([\d.]+) and ([\d.]+) MiB at context 1, 2 and 4",
                       " ".join(text.split())).groups()
    printed = []
    for context in (1, 2, 4):
        result = run_command(["plan", "strategy=fsdp", "devices=4", f"strategy.context_parallel_size={context}",
                              "model.block_size=32768", "data.batch_size=1", "model.dropout=0.0"], tmp_path)
        printed.append(re.search(r"activations: ([\d.]+) MiB", result.stdout).group(1))
    assert tuple(printed) == quoted
