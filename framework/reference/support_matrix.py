"""docs/reference/support-matrix.md: every strategy x precision, on the CPU and on a GPU.

A CPU cell is what a run of the default job decides before launch (the compatibility table and
every other check, framework/preflight): refused with the table's reason, or accepted; an accepted
cell names the tests that train it on the CPU and check its numbers (the tests marked
`pytest.mark.matrix`, found by collecting the suite, never a list kept here). A GPU cell is the
GPU check's result for that strategy and precision (benchmarks/results/gpu_check.md), with the
device and date it ran on, or "not run".
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from framework.accelerator.cpu import CPUAccelerator
from framework.config.compose import composer
from framework.errors import UserError
from framework.preflight import prepare

PRECISIONS_FIRST = ("32", "bf16", "16", "bf16_true", "16_true", "64")


@dataclass(frozen=True)
class Cell:
    accepted: bool
    reason: str = ""  # why it is refused: the first sentence of the refusal
    with_hardware: bool = False  # refused, but accepted on a CPU with fp16 and bf16 hardware


@contextlib.contextmanager
def cpu_half_hardware(present: bool):
    """The CPU's fp16/bf16 hardware predicates pinned (the page must not depend on the machine that
    writes it; the rules that read them: framework/config/compatibility.py)."""
    saved = CPUAccelerator.fast_fp16, CPUAccelerator.fast_bf16
    CPUAccelerator.fast_fp16 = CPUAccelerator.fast_bf16 = lambda self: present
    try:
        yield
    finally:
        CPUAccelerator.fast_fp16, CPUAccelerator.fast_bf16 = saved


def single_process(strategy: str) -> bool:
    return strategy in ("single_device", "single_xla")


def cpu_cells(conf: Path, strategies: list[str], precisions: list[str]) -> dict[tuple[str, str], Cell]:
    """Each strategy x precision on the CPU at 2 processes (1 for the single-process strategies), on
    a CPU without fp16/bf16 hardware; a refused cell is tried again as on a CPU with it. One
    composition per strategy, its precision node swapped for each option's YAML (what `precision=X`
    composes: the precision options have no defaults list and no interpolation)."""
    cells = {}
    with composer(conf) as compose_one:
        composed = {}
        for strategy in strategies:
            devices = 1 if single_process(strategy) else 2
            composed[strategy] = compose_one("train", [f"strategy={strategy}", "accelerator=cpu", f"devices={devices}"])

        def decide(strategy: str, precision: str) -> Cell:
            cfg = composed[strategy].copy()
            cfg.precision = OmegaConf.load(conf / "precision" / f"{precision}.yaml")
            try:
                prepare(cfg)
                return Cell(True)
            except UserError as err:
                return Cell(False, _first_sentence(str(err)))

        with cpu_half_hardware(False):
            for strategy in strategies:
                for precision in precisions:
                    cells[strategy, precision] = decide(strategy, precision)
        with cpu_half_hardware(True):
            for key, cell in cells.items():
                if not cell.accepted and decide(*key).accepted:
                    cells[key] = Cell(False, cell.reason, with_hardware=True)
    return cells


def _first_sentence(text: str) -> str:
    text = " ".join(text.split("\n")[0].split())
    cut = re.search(r"[.;](?:\s|$)", text)
    return text[: cut.start() + 1].rstrip(";") if cut else text


def gpu_cells(results: Path) -> tuple[str, dict[tuple[str, str], str]]:
    """(where and when the check ran, {(strategy, precision): result}) from the GPU check's table:
    'ok' where a row of that cell passed, else the first row's result; refusals with their reason."""
    if not results.is_file():
        return "", {}
    lines = results.read_text().splitlines()
    header = lines[0] if lines else ""
    device = header.split(",")[0].strip()
    date = re.search(r"\d{4}-\d{2}-\d{2}", header)
    torch_version = re.search(r"torch ([\w.+]+)", header)
    where = f"{device}, torch {torch_version.group(1) if torch_version else '?'}, {date.group(0) if date else 'undated'}"
    columns: list[str] = []
    found: dict[tuple[str, str], list[str]] = {}
    for line in lines:
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "strategy" in cells and "result" in cells:
            columns = cells
            continue
        if not columns or set("".join(cells)) <= set("-: ") or len(cells) != len(columns):
            continue
        row = dict(zip(columns, cells))
        result = row["result"]
        if result == "refused" and row.get("why"):
            result = f"refused: {_first_sentence(row['why'])}"
        found.setdefault((row["strategy"], row["precision"]), []).append(result)
    return where, {cell: ("ok" if "ok" in results_ else results_[0]) for cell, results_ in found.items()}


def _tests_cell(tests: list[str]) -> str:
    names = sorted({t.split("::", 1)[0].rsplit("/", 1)[-1] + "::" + t.split("::", 1)[1].split("[")[0] for t in tests})
    shown = ", ".join(f"`{n}`" for n in names[:2]) + (f" +{len(names) - 2}" if len(names) > 2 else "")
    return f"trained, {len(tests)} test{'s' if len(tests) != 1 else ''}: {shown}"


def render(cpu: dict[tuple[str, str], Cell], tested: dict[tuple[str, str], list[str]], gpu_where: str,
           gpu: dict[tuple[str, str], str], strategies: list[str], precisions: list[str]) -> str:
    accepted = sum(c.accepted for c in cpu.values())
    trained = sum(1 for k, c in cpu.items() if c.accepted and tested.get(k))
    out = [
        "# Support matrix",
        "",
        "<!-- Generated by `make reference` (framework/reference/support_matrix.py); edit the code, the",
        "     tests or the GPU results, not this page. tests/docs/test_reference.py fails when it is stale. -->",
        "",
        "Every strategy with every precision, as the default job on the CPU decides it before launch (at",
        "2 processes, 1 for the single-process strategies), and as the GPU check found it on a GPU.",
        "`strategy=auto` is single_device at one process and ddp at more. The XLA strategies run with",
        "`accelerator=xla` (their own environment: [XLA and TPUs](../xla.md)).",
        "",
        "- **trained**: accepted, and trained on the CPU by the tests named (marked `matrix` in tests/),",
        "  which check its losses or weights against a reference; the whole list is",
        "  `pytest -m matrix --collect-only -q`.",
        "- **accepted**: the run starts; no test trains this cell on the CPU.",
        "- **refused**: the run stops before launch with this reason (the compatibility table,",
        "  framework/config/compatibility.py, and the other checks of framework/preflight).",
        f"- **GPU**: the GPU check's result at this cell (benchmarks/results/gpu_check.md: {gpu_where or 'never run'});",
        "  *not run* where the check has no row for it. Multi-GPU NCCL runs: see [GPUs](../gpus.md).",
        "",
        f"{accepted} of {len(cpu)} cells are accepted on the CPU; {trained} of them are trained by a test.",
        "",
    ]
    mark = {"trained": "**T**", "accepted": "A", "refused": "-", "hardware": "A*"}

    def kind(key: tuple[str, str]) -> str:
        cell = cpu[key]
        if cell.accepted:
            return "trained" if tested.get(key) else "accepted"
        return "hardware" if cell.with_hardware else "refused"

    out += ["On the CPU at a glance (**T** trained by a test, A accepted, A* accepted on a CPU with fp16/bf16",
            "hardware, - refused; the sections below give the tests and the reasons):", "",
            "| strategy | " + " | ".join(f"`{p}`" for p in precisions) + " |",
            "|---|" + "---|" * len(precisions)]
    out += [f"| {s} | " + " | ".join(mark[kind((s, p))] for p in precisions) + " |" for s in strategies]
    out.append("")
    for strategy in strategies:
        out += [f"## {strategy}", "", "| precision | CPU | GPU |", "|---|---|---|"]
        for precision in precisions:
            cell = cpu[strategy, precision]
            if cell.accepted:
                text = _tests_cell(tested[strategy, precision]) if tested.get((strategy, precision)) else "accepted"
            elif cell.with_hardware:
                text = f"accepted on a CPU with fp16/bf16 hardware (AVX512-FP16, AMX); refused without: {cell.reason}"
            else:
                text = f"refused: {cell.reason}"
            gpu_text = gpu.get((strategy, precision), "*not run*")
            out.append(f"| `{precision}` | {text.replace('|', '/')} | {gpu_text.replace('|', '/')} |")
        out.append("")
    return "\n".join(out)


def ordered_precisions(names: list[str]) -> list[str]:
    return [p for p in PRECISIONS_FIRST if p in names] + sorted(p for p in names if p not in PRECISIONS_FIRST)
