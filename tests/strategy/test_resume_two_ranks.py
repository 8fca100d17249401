"""Half a run, then resume=auto, under each multi-process strategy and checkpoint_io: the state at
the end is bit for bit the straight run's."""
from __future__ import annotations

import csv

import pytest

from tests.conftest import assert_state_equal, checkpoints, load_model_state, load_optimizer_state, run_inprocess
from tests.helpers.two_ranks import STEPS, run_world, shared, world

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("strategy,io", [("ddp", "torch"), ("fsdp", "torch"), ("ddp", "async"), ("deepspeed_stage_1", "torch"),
                                         ("deepspeed_stage_2", "torch"), ("deepspeed_stage_3", "torch"),
                                         ("fsdp", "dcp"), ("deepspeed_stage_3", "dcp")])
def test_multi_process_resume_is_bit_exact(tmp_path, strategy, io):
    """Half the steps, then resume=auto to the end, through checkpoint_io=io: the state at the end is
    bit for bit the straight run's (the shared run: how it wrote its checkpoints does not change what
    it trained)."""
    resumed = run_world(tmp_path, "resumed", strategy, 2, [f"checkpoint_io={io}", f"trainer.max_steps={STEPS // 2}"])
    half = checkpoints(resumed)[-1]
    written = {p.relative_to(half): (p.stat().st_ino, p.stat().st_mtime_ns) for p in half.rglob("*") if p.is_file()}
    run_inprocess(world(strategy, 2, [f"checkpoint_io={io}", "resume=auto"]), resumed)
    # it went on from the half-way checkpoint: that one was read, never written again (a run that
    # silently started over would end with the same weights, rewriting it on the way)
    assert {p.relative_to(half): (p.stat().st_ino, p.stat().st_mtime_ns) for p in half.rglob("*") if p.is_file()} \
        == written
    steps = [int(r["step"]) for r in csv.DictReader(open(resumed / "metrics.csv")) if r.get("train/loss")]
    assert steps == list(range(1, STEPS + 1))  # each step trained once: the first half, then the rest
    a, b = checkpoints(shared(strategy))[-1], checkpoints(resumed)[-1]
    assert a.name == b.name == f"step_{STEPS:06d}"
    assert [c.name for c in checkpoints(resumed)] == [f"step_{STEPS // 2:06d}", f"step_{STEPS:06d}"]
    assert_state_equal(load_model_state(a), load_model_state(b), "model")
    assert_state_equal(load_optimizer_state(a), load_optimizer_state(b), "optimizer")
