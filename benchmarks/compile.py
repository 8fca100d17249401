"""`trainer.compile=true` on the CPU: eager and compiled runs of the same job side by side
(A B A B ..., ROUNDS rounds), one process and fsdp at 2 processes. Per run: the first step's time
(compilation included: the loop's first logged step spans it) and the steady step (the median of
the steps after the first), from the run's metrics.csv; the compiled runs also say how long their
first forward took. Inductor's cache starts empty (a directory of this script's own), so round 1
of a compiled case is a cold compile and the later rounds find their kernels cached, as a user's
second run does.

    .venv/bin/python benchmarks/compile.py        (about 8 minutes)
"""
from __future__ import annotations

import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from memory_per_rank import step_seconds  # benchmarks/ is on sys.path when a script runs
from results_table import publish

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 3
STEPS = 12
MODEL = ["model.n_layer=4", "model.n_embd=256", "model.n_head=4", "model.block_size=128", "model.dropout=0.0"]
RUN = ["data.batch_size=16", "data.max_bytes=2000000", "trainer.val_at_start=false", "trainer.val_every=1000",
       f"trainer.max_steps={STEPS}", "trainer.log_every=1", "trainer.progress_bar=false", "trainer.plot=false",
       "logger=[csv]", "callbacks=[]"]
CASES = {"one process": ["strategy=single_device", "devices=1"], "fsdp, 2 processes": ["strategy=fsdp", "devices=2"]}
FIRST_FORWARD = re.compile(r"compile: the first forward took ([0-9.]+) s")


def run(workdir: Path, world: list[str], compiled: bool, cache: Path) -> dict:
    out = workdir / f"run{len(list(workdir.iterdir()))}"
    command = [sys.executable, str(ROOT / "train.py"), *world, *MODEL, *RUN, f"trainer.compile={str(compiled).lower()}",
               f"hydra.run.dir={out}"]
    result = subprocess.run(command, cwd=workdir, capture_output=True, text=True,
                            env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)})
    if result.returncode != 0:
        sys.exit(f"compile benchmark: {' '.join(command)} failed:\n{result.stderr[-2000:]}")
    seconds = step_seconds(out)
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    said = FIRST_FORWARD.search(result.stdout)
    return {"first": seconds[0], "steady": statistics.median(seconds[1:]),
            "first_forward": float(said.group(1)) if said else None,
            "losses": [float(r["train/loss"]) for r in rows if r.get("train/loss")]}


def main() -> None:
    lines = [f"GPT (n_layer 4, n_embd 256, 4 heads, block 128), batch 16, fp32, AdamW, {STEPS} steps, CPU, "
             f"{ROUNDS} interleaved rounds (eager, compiled, eager, ...). First step: compilation included; round 1 "
             "of a compiled case compiles with an empty inductor cache (cold), later rounds find it filled (warm); an "
             "eager run compiles nothing. "
             "Steady step: median of steps 2-12, then the median over rounds.", "",
             "| case | mode | first step, round 1 (s) | first step, rounds 2-3 (s) | first forward, cold (s) "
             "| steady step (ms) "
             "| steady vs eager | loss at step 12 |", "|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        workdir, cache = Path(tmp) / "runs", Path(tmp) / "inductor-cache"
        workdir.mkdir()
        for case, world in CASES.items():
            got: dict[bool, list[dict]] = {False: [], True: []}
            for _ in range(ROUNDS):
                for compiled in (False, True):
                    got[compiled].append(run(workdir, world, compiled, cache))
            eager_steady = statistics.median(r["steady"] for r in got[False])
            for compiled, mode in ((False, "eager"), (True, "compiled blocks")):
                runs = got[compiled]
                steady = statistics.median(r["steady"] for r in runs)
                warm = statistics.median(r["first"] for r in runs[1:])
                forward = f"{runs[0]['first_forward']:.1f}" if runs[0]["first_forward"] is not None else "-"
                lines.append(f"| {case} | {mode} | {runs[0]['first']:.2f} | {warm:.2f} | {forward} | "
                             f"{1000 * steady:.0f} | {steady / eager_steady:.2f}x | {runs[0]['losses'][-1]:.4f} |")
                print(lines[-1], flush=True)
    publish("compile", lines)


if __name__ == "__main__":
    main()
