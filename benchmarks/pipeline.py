"""Pipeline stages on this machine, side by side in one run, each a real `python train.py ...`.

- `bubble` (2 processes, one core and one thread each): a GPT of 8 blocks cut into 2 stages under
  gpipe and 1f1b with 2, 4 and 8 microbatches, against ddp@2 on the same global batch (the same
  work on the same two single-threaded ranks, split by samples instead of layers). The measured
  idle share of a step is 1 - ddp's step / the pipeline's step (messages, the stages' imbalance and
  smaller matrices count as idle too). The schedule's theory: (p-1)/(m+p-1).
- `step` (4 processes on 2 cores: oversubscribed, so a ratio here says what the CPU's sharing
  costs as much as what the schedule does): ms per step of ddp@4, fsdp@4, pipeline@4 (1f1b, 4
  microbatches) and pipeline 2 x fsdp 2, at the same global batch of 16.

Writes benchmarks/results/pipeline_<part>.md.

    .venv/bin/python benchmarks/pipeline.py [bubble] [step]        (~10 minutes)
"""
from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_table import publish  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL = ["model.n_layer=8", "model.n_embd=256", "model.n_head=8", "model.block_size=128", "model.dropout=0.0"]
RUN = ["accelerator=cpu", "data.max_bytes=2000000", "trainer.val_at_start=false", "trainer.val_every=1000",
       "trainer.log_every=1", "trainer.progress_bar=false", "trainer.plot=false", "logger=csv", "callbacks=[]",
       "trainer.test_at_end=false"]
STEPS = 12


def step_ms(workdir: Path, name: str, args: list[str]) -> float:
    """The median ms per step after the first two (a synchronised clock: the loop's meter reads
    after each step's loss reached the host)."""
    out = workdir / name
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), *MODEL, *RUN, *args, f"trainer.max_steps={STEPS}",
                             f"hydra.run.dir={out}"], cwd=workdir, capture_output=True, text=True, timeout=1800)
    if result.returncode:
        sys.exit(f"pipeline benchmark: {name} failed:\n{result.stderr[-3000:]}")
    rows = [r for r in csv.DictReader(open(out / "metrics.csv")) if r.get("train/tokens_per_s")]
    seconds = [float(rows[0]["train/tokens"]) / float(r["train/tokens_per_s"]) for r in rows]
    return 1000 * statistics.median(seconds[2:])


def bubble(workdir: Path) -> None:
    ddp = step_ms(workdir, "ddp", ["strategy=ddp", "devices=2", "data.batch_size=8"])
    lines = ["GPT 8 x 256, context 128, global batch 16, fp32, AdamW; 2 stages of 4 blocks on 2 processes (one "
             f"core and thread each), against ddp@2 on the same batch: {ddp:.0f} ms/step. Measured idle share: 1 - "
             "ddp's step / the pipeline's step. Theory: (p-1)/(m+p-1).", "",
             "| schedule | microbatches | ms / step | vs ddp@2 | idle, measured | idle, theory |",
             "|---|---|---|---|---|---|"]
    for schedule in ("gpipe", "1f1b"):
        for m in (2, 4, 8):
            ms = step_ms(workdir, f"{schedule}-{m}", ["strategy=pipeline", "devices=2", "data.batch_size=16",
                                                      f"strategy.schedule={schedule}", f"strategy.microbatches={m}"])
            lines.append(f"| {schedule} | {m} | {ms:.0f} | {ms / ddp:.2f}x | {1 - ddp / ms:.0%} | "
                         f"{1 / (m + 1):.0%} |")
            print(lines[-1], flush=True)
    publish("pipeline_bubble", lines)


def step(workdir: Path) -> None:
    runs = {"ddp@4": ["strategy=ddp", "devices=4", "data.batch_size=4"],
            "fsdp@4": ["strategy=fsdp", "devices=4", "data.batch_size=4"],
            "pipeline@4 (1f1b, 4 microbatches)": ["strategy=pipeline", "devices=4", "data.batch_size=16"],
            "pipeline 2 x fsdp 2 (1f1b, 2 microbatches)": ["strategy=pipeline", "devices=4",
                                                           "strategy.pipeline_parallel_size=2", "data.batch_size=8"]}
    lines = ["GPT 8 x 256, context 128, fp32, AdamW, global batch 16, 4 processes on 2 cores (oversubscribed: "
             "the ranks take turns on the cores, so the pipeline's idle ranks free a core for the others).", "",
             "| strategy | ms / step | vs ddp@4 |", "|---|---|---|"]
    times = {name: step_ms(workdir, name.split()[0].replace("@", "_"), args) for name, args in runs.items()}
    for name, ms in times.items():
        lines.append(f"| {name} | {ms:.0f} | {ms / times['ddp@4']:.2f}x |")
    publish("pipeline_step", lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", help="bubble, step (default: both)")
    args = parser.parse_args()
    unknown = set(args.parts) - {"bubble", "step"}
    if unknown:
        parser.error(f"unknown part(s) {', '.join(sorted(unknown))}: choose bubble, step")
    with tempfile.TemporaryDirectory() as tmp:
        for part in args.parts or ["bubble", "step"]:
            {"bubble": bubble, "step": step}[part](Path(tmp))


if __name__ == "__main__":
    main()
