"""The front page's picture and results table, made from measurements, stamped with date and commit.

    python benchmarks/front_page.py          # the table in README.md from benchmarks/results/
    python benchmarks/front_page.py --run    # also trains the default job (about a minute) and draws
                                             # docs/assets/default-job.png from its metrics.csv

The table sits in README.md between `<!-- results: start -->` and `<!-- results: end -->`; every
figure in it is read from a results file written by a benchmark (benchmarks/README.md says how
each is measured), so it changes only when a benchmark is rerun. tests/docs/test_front_page.py
fails when the table is not what this script makes of the committed results.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
PICTURE = ROOT / "docs" / "assets" / "default-job.png"
DEFAULT_JOB = RESULTS / "default_job.md"
START, END = "<!-- results: start -->", "<!-- results: end -->"


def markdown_rows(path: Path, first_column: str) -> list[dict[str, str]]:
    """The rows of the first table in `path` whose header starts with `first_column`."""
    rows, columns = [], None
    for line in path.read_text().splitlines():
        if not line.startswith("|"):
            if columns and rows:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if columns is None:
            if cells[0] == first_column:
                columns = cells
            continue
        if set("".join(cells)) <= set("-: "):
            continue
        rows.append(dict(zip(columns, cells)))
    return rows


def _stamp() -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return f"{datetime.date.today().isoformat()}, commit {commit.stdout.strip() or 'unknown'}"


def results_table() -> list[str]:
    """The README's results, from the committed result files alone (no date, no commit: the
    stamp line above it says when it was made)."""
    out = []
    job = markdown_rows(DEFAULT_JOB, "measure")
    if job:
        figures = {row["measure"]: row["value"] for row in job}
        out += ["**The default job** (`make train`: 300 steps of the 0.4M-parameter GPT on the standard library's "
                f"source, CPU): validation loss {figures['val/loss at step 0']} -> {figures['val/loss at the end']} "
                f"in {figures['wall time']} ({figures['machine']}).", ""]
    overhead = markdown_rows(RESULTS / "overhead.md", "case")
    resolved = step_overhead()
    if overhead:
        out += ["**Overhead per step against a raw PyTorch loop and Lightning** (CPU, benchmarks/results/overhead.md; "
                "1.00 = the raw loop; the tiny MLP's framework figure is benchmarks/results/step_overhead.md's, "
                "resolved over many interleaved turns, with the middle half of its per-turn ratios):", "",
                "| job | raw loop (ms) | this framework | Lightning |", "|---|---|---|---|"]
        for case in dict.fromkeys(row["case"] for row in overhead):
            by = {row["trainer"]: row for row in overhead if row["case"] == case}
            ratio = "ratio to the raw loop (median of per-round ratios)"
            raw, ours = by['raw PyTorch loop']['ms per step (median)'], f"{float(by['this framework'][ratio]):.2f}x"
            if case.startswith("tiny MLP") and resolved:
                raw, ours = resolved
            out.append(f"| {case} | {raw} | {ours} | {float(by['Lightning'][ratio]):.2f}x |")
        out.append("")
    memory = [r for r in markdown_rows(RESULTS / "memory_peaks.md", "model")
              if r["model"] == "~100M" and r["act. ckpt"] == "False" and r["N"] in ("2", "4")]
    if memory:
        out += ["**Training memory per rank** (a ~100M GPT, fp32 AdamW, CPU processes; "
                "benchmarks/results/memory_peaks.md):", "",
                "| processes | strategy | peak per rank (MiB) | vs ddp |", "|---|---|---|---|"]
        out += [f"| {r['N']} | {r['strategy']} | {r['training peak / rank (MiB)']} | {r['vs ddp']} |" for r in memory]
        out.append("")
    gpu = RESULTS / "gpu_check.md"
    steady = markdown_rows(gpu, "run") if gpu.is_file() else []
    if steady:
        header = gpu.read_text().splitlines()[0]
        device = header.split(" (")[0]
        torch_version = re.search(r"torch ([\w.+]+)", header).group(1)
        date = re.search(r"run (\d{4}-\d{2}-\d{2})", header).group(1)
        out += [f"**On a GPU** ({device}, torch {torch_version}, {date}; GPT 12 x 768, context 1024, bf16; "
                "benchmarks/results/gpu_check.md):", "",
                "| loop | ms per step | vs raw eager | vs raw compiled |", "|---|---|---|---|"]
        out += [f"| {r['run']} | {r['ms/step']} | {r['vs raw eager']} | {r['vs raw compiled']} |" for r in steady]
        out.append("")
    return out


def step_overhead() -> tuple[str, str] | None:
    """(the raw loop's mean ms per step, the framework's ratio with the middle half of the per-turn
    ratios) from benchmarks/results/step_overhead.md, or None where it has none."""
    path = RESULTS / "step_overhead.md"
    if not path.is_file():
        return None
    text = path.read_text()
    ratio = re.search(r"Framework / raw: \*\*([\d.]+)x\*\* \(median over \d+ turns; middle half ([\d.]+)-([\d.]+)", text)
    raw = re.search(r"\| raw PyTorch loop \| ([\d.]+) ms \|", text)
    if not ratio or not raw:
        return None
    low, high = float(ratio.group(2)), float(ratio.group(3))
    return f"{float(raw.group(1)):.2f}", f"{float(ratio.group(1)):.2f}x ({low:.2f}-{high:.2f})"


def block(stamp: str) -> str:
    return "\n".join([START, f"<!-- made by benchmarks/front_page.py ({stamp}) from benchmarks/results/ -->", "",
                      *results_table(), END])


def write_readme(stamp: str) -> None:
    text = README.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"README.md has no {START} ... {END} block to fill")
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    README.write_text(head + block(stamp) + tail)


def run_default_job(stamp: str) -> None:
    """`python train.py` as `make train` runs it; its curves drawn with the stamp, its figures kept."""
    import platform
    import time

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        subprocess.run([sys.executable, str(ROOT / "train.py"), "name=front_page", "trainer.progress_bar=false",
                        "trainer.plot=false"], cwd=folder, check=True, capture_output=True)
        seconds = time.perf_counter() - start
        rows = list(csv.DictReader(open(Path(folder) / "outputs" / "front_page" / "metrics.csv")))
    train = [(int(r["step"]), float(r["train/loss"])) for r in rows if r.get("train/loss")]
    val = [(int(r["step"]), float(r["val/loss"])) for r in rows if r.get("val/loss")]
    import torch

    machine = f"{torch.get_num_threads()} threads, torch {torch.__version__}, {platform.machine()}"
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
    ax.plot(*zip(*train), label="train/loss")
    ax.plot(*zip(*val), marker="o", label="val/loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats per byte)")
    ax.set_title("The default job: `python train.py` (GPT 2 x 128 on the stdlib's source, CPU)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.text(0.99, 0.01, f"benchmarks/front_page.py, {stamp}; {machine}", ha="right", va="bottom", fontsize=7,
             color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    PICTURE.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PICTURE)
    DEFAULT_JOB.write_text("\n".join([
        f"The default job as `make train` runs it ({stamp}).", "",
        "| measure | value |", "|---|---|",
        f"| val/loss at step 0 | {val[0][1]:.2f} |", f"| val/loss at the end | {val[-1][1]:.2f} |",
        f"| steps | {train[-1][0]} |", f"| wall time | {seconds:.0f} s |", f"| machine | {machine} |", ""]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="store_true", help="train the default job and draw its picture first")
    args = parser.parse_args(argv)
    stamp = _stamp()
    if args.run:
        run_default_job(stamp)
    write_readme(stamp)
    print(block(stamp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
