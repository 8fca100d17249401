"""fault_tolerance=torchft on this machine, side by side in one run, each a real `python train.py ...`
(a GPT of 4 x 128, context 64, batch 8 per group or rank, fp32, AdamW, gloo).

- `overhead`: ms per step of plain ddp@2 against 2 replica groups of 1 process (the same world size
  and global batch): the quorum before each step, the gradient average over torchft's
  reconfigurable gloo group and the commit vote, against ddp's bucketed all-reduce.
- `kill`: 2 groups x 1 process, 80 steps; group 1 SIGKILLs itself after step 20 and the command
  restarts it. The survivor's steps lost (not committed: goal 0), the steps it took alone, the
  seconds from the restart to the restarted group's first step with its peer (its heal), and the
  steps trained twice (0: it copies the survivor's state).
- against the restart-from-checkpoint path: ddp@2 with trainer.max_restarts=1 and a checkpoint
  every 10 steps, rank 1 SIGKILLed after step 25: every rank restarts and trains steps 21-25 again.

Writes benchmarks/results/fault_tolerance.md.

    .venv/bin/python benchmarks/fault_tolerance.py        (~3 minutes)
"""
from __future__ import annotations

import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_table import publish  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUN = ["model.n_layer=4", "model.n_embd=128", "model.n_head=4", "model.block_size=64", "model.dropout=0.0",
       "accelerator=cpu", "data.max_bytes=2000000", "data.batch_size=8", "trainer.val_at_start=false",
       "trainer.val_every=1000", "trainer.log_every=1", "trainer.progress_bar=false", "trainer.plot=false",
       "trainer.test_at_end=false"]
FT = ["fault_tolerance=torchft", "fault_tolerance.heartbeat_timeout_ms=1000", "fault_tolerance.join_timeout_ms=200"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "FRAMEWORK_TRUST_ALLOW": "tests.helpers."}  # the fault injectors


def train(workdir: Path, name: str, args: list[str]) -> tuple[Path, float, str]:
    out = workdir / name
    started = time.time()
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), *RUN, *args, f"hydra.run.dir={out}"], cwd=workdir,
                            capture_output=True, text=True, timeout=1800, env=ENV)
    if result.returncode:
        sys.exit(f"fault_tolerance benchmark: {name} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return out, time.time() - started, result.stdout


def step_ms(run_dir: Path, skip: int = 5) -> float:
    """The median ms per step after the first `skip` (the loop's meter: tokens of the step / tokens per s)."""
    rows = [r for r in csv.DictReader(open(run_dir / "metrics.csv")) if r.get("train/tokens_per_s")]
    seconds = [float(rows[0]["train/tokens"]) / float(r["train/tokens_per_s"]) for r in rows]
    return 1000 * statistics.median(seconds[skip:])


def main() -> None:
    lines = ["GPT 4 x 128, context 64, batch 8 per group or rank (global 16), fp32, AdamW, gloo; 2 processes on "
             "this machine's 2 cores.", ""]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        ddp, _, _ = train(workdir, "ddp", ["strategy=ddp", "devices=2", "trainer.max_steps=60", "callbacks=[]"])
        ft, _, _ = train(workdir, "ft", [*FT, "trainer.max_steps=60", "callbacks=[]"])
        ddp_ms, ft_ms = step_ms(ddp), statistics.mean(step_ms(ft / f"replica_{g}") for g in (0, 1))
        lines += ["| per step | ms | vs ddp@2 |", "|---|---|---|", f"| ddp@2 | {ddp_ms:.1f} | 1.00x |",
                  f"| torchft, 2 groups x 1 | {ft_ms:.1f} | {ft_ms / ddp_ms:.2f}x |", ""]
        killed, _, _ = train(workdir, "killed", [*FT, "trainer.max_steps=80", "callbacks=[]",
                                                 "+callbacks.killer._target_=tests.helpers.killer.KillReplicaGroupOnce",
                                                 "+callbacks.killer.step=20"])
        summary = json.loads((killed / "summary.json").read_text())
        survivor, restarted = summary["replica_groups"]
        (heal,) = restarted["replicas"]["heals"]
        back_after = heal["at"] - restarted["started_at"][-1]
        alone = survivor["replicas"]["participants"].get("1", 0)
        ckpt, _, out = train(workdir, "restarted", ["strategy=ddp", "devices=2", "trainer.max_steps=80",
                                                    "trainer.max_restarts=1", "callbacks=[checkpoint]",
                                                    "callbacks.checkpoint.every_n_steps=10",
                                                    "+callbacks.killer._target_=tests.helpers.killer.KillRankOnce",
                                                    "+callbacks.killer.rank=1", "+callbacks.killer.step=25"])
        resumed_at = int(re.search(r"resumed from .*step_0*(\d+)", out).group(1))
        lines += ["| one group (or rank) SIGKILLed | steps the others lost | steps trained twice | "
                  "seconds until the group steps again | weights agree at the end |", "|---|---|---|---|---|",
                  f"| torchft, 2 groups x 1, group 1 after step 20 of 80 | {survivor['replicas']['uncommitted_steps']} "
                  f"(it took {alone} steps alone) | 0 (healed at step {heal['step']}, copy {heal['seconds']:.2f} s) | "
                  f"{back_after:.1f} (restart to healed) | {summary['weights_agree']} |",
                  f"| ddp@2, max_restarts=1, checkpoints every 10, rank 1 after step 25 | every rank stops | "
                  f"{25 - resumed_at} (resumed at step {resumed_at}) | the whole job restarts | - |"]
    publish("fault_tolerance", lines)


if __name__ == "__main__":
    main()
