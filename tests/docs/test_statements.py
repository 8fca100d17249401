"""A statement of behaviour in README.md or docs/ points to the test that shows it. A paragraph (or
a table row) that promises what a test would have to show (equal within 1e-N, bit for bit,
bit-identical or bit-exact, sample-exact, "tested") names a test file (tests/...py, or a test_*.py of
a table's tests column) or a benchmark; every tests/ path named exists, and a test function named in
backticks beside it exists in one of the files it names. A promise without its test is rewritten
or given one."""
from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PROMISE = re.compile(r"within 1e-\d|bit for bit|bit-identical|bit-exact|bit exact|sample-exact|sample exact|\btested\b",
                     re.I)
CITED = re.compile(r"tests/[\w/.-]*|benchmarks/|\btest_\w+\.py")


def statements(text: str) -> list[str]:
    """The page's paragraphs and table rows, code blocks and headings left out."""
    text = re.sub(r"^```.*?^```$", "", text, flags=re.S | re.M)
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        lines = [line for line in paragraph.splitlines() if not line.startswith("#")]
        if lines and lines[0].lstrip().startswith("|"):
            found += lines
        elif lines:
            found.append(" ".join(lines))
    return found




@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_promise_names_the_test_that_shows_it(page):
    unbacked = [s for s in statements(page.read_text()) if PROMISE.search(s) and not CITED.search(s)]
    assert not unbacked, f"{page.relative_to(ROOT)}: a promise without its test: " + " | ".join(
        " ".join(s.split())[:200] for s in unbacked)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_the_tests_a_page_names_exist(page):
    for statement in statements(page.read_text()):
        files = [ROOT / path.rstrip(".,;:)") for path in re.findall(r"tests/[\w/.-]+", statement)]
        for path in files:
            assert path.exists(), f"{page.relative_to(ROOT)}: {path.relative_to(ROOT)} does not exist"
        sources = "".join(p.read_text() for p in files if p.is_file() and p.suffix == ".py")
        for name in re.findall(r"`(test_\w+)`", statement):
            if sources:
                assert f"def {name}(" in sources, f"{page.relative_to(ROOT)}: no test {name} in {files}"


def test_the_check_finds_a_promise_without_its_test():
    page = "Resumes bit for bit under every strategy.\n\nEqual within 1e-5 (tests/tasks/test_decay.py).\n"
    assert [s for s in statements(page) if PROMISE.search(s) and not CITED.search(s)] == [
        "Resumes bit for bit under every strategy."]
