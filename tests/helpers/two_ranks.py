"""The two-process runs the strategy tests share: the built-in GPT at 2 ranks, no dropout,
accumulation and clipping on, a checkpoint half-way through its STEPS steps. The same run is the reference of the
equivalence tests and the straight run of the resume tests (tests/helpers/run_cache.py trains it
once a session)."""
from __future__ import annotations

import csv
from pathlib import Path

from tests.conftest import TINY_GPT, run_inprocess
from tests.helpers.run_cache import trained_run

STEPS = 4
# No dropout (each rank would draw its own masks) and no validation at the start: the losses of
# the first steps are compared one by one. Accumulation and clipping on, a checkpoint half-way:
# the same runs are the references of the equivalence tests and the "straight" runs the resume
# tests compare with (shared through tests/helpers/run_cache.py).
BASE = [*TINY_GPT, f"trainer.max_steps={STEPS}", "trainer.log_every=1", "trainer.val_every=2",
        "model.dropout=0.0", "trainer.val_at_start=false", "callbacks=[checkpoint]", "trainer.accumulate=2",
        "trainer.clip_grad_norm=0.5", f"scheduler.total_steps={STEPS}", f"callbacks.checkpoint.every_n_steps={STEPS // 2}",
        "callbacks.checkpoint.keep_last_k=4"]
STRATEGIES = ["ddp_spawn", "fsdp", "fsdp_cpu_offload", "ddp_sharded", "deepspeed_stage_1",
              "deepspeed_stage_2", "deepspeed_stage_2_offload", "deepspeed_stage_3", "deepspeed_stage_3_offload"]
# bf16 rounds activations to 8 bits of mantissa; strategies differ in where they round (FSDP
# gathers bf16 parameters, DeepSpeed keeps bf16 module weights), so per-step losses agree to
# about 1e-2 relative, not to float32 precision.
TOLERANCE = {"32": 1e-5, "bf16": 2e-2}


def train_losses(out) -> list[float]:
    rows = csv.DictReader(open(out / "metrics.csv"))
    return [float(r["train/loss"]) for r in rows if r.get("train/loss")]


def world(strategy, devices=2, extra=()) -> list[str]:
    return [*BASE, f"strategy={strategy}", f"devices={devices}", *extra]


def run_world(tmp_path, name, strategy, devices, extra=()):
    out = tmp_path / name
    run_inprocess(world(strategy, devices, extra), out)
    return out


def shared(strategy, precision="32", extra=()) -> Path:
    """The strategy's run at 2 processes, trained once for the whole session."""
    return trained_run(world(strategy, 2, [f"precision={precision}", *extra]))


