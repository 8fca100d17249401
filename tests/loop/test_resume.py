"""N steps + resume + N steps == 2N steps, bit for bit (weights, optimizer, RNG, loader)."""
from __future__ import annotations

import shutil

import pytest

from tests.conftest import (
    DIGITS,
    TINY_GPT,
    assert_state_equal,
    checkpoints,
    load_model_state,
    load_optimizer_state,
    run_inprocess,
)

N = 6
# dropout draws from the RNG; accumulation, clipping, a schedule and validation all run across
# the resume point; the corpus is long enough that the resume is mid-epoch.
GPT_RESUME = [*TINY_GPT, "model.dropout=0.1", "trainer.accumulate=2", "trainer.val_every=4",
              "trainer.clip_grad_norm=0.5", f"scheduler.total_steps={2 * N}", "scheduler.warmup_steps=3",
              f"callbacks.checkpoint.every_n_steps={N}", "callbacks.checkpoint.keep_last_k=5"]


def _assert_same_final_state(a_dir, b_dir, step):
    a = next(p for p in checkpoints(a_dir) if p.name == f"step_{step:06d}")
    b = next(p for p in checkpoints(b_dir) if p.name == f"step_{step:06d}")
    assert_state_equal(load_model_state(a), load_model_state(b), "model")
    assert_state_equal(load_optimizer_state(a), load_optimizer_state(b), "optimizer")


@pytest.mark.parametrize("precision", ["32", pytest.param("16", marks=pytest.mark.slow),  # mixed precisions: make test
                                       pytest.param("bf16", marks=pytest.mark.slow)])
def test_stop_then_resume_with_more_steps(tmp_path, precision):
    base = [*GPT_RESUME, f"precision={precision}"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_inprocess([*base, f"trainer.max_steps={2 * N}"], straight)
    run_inprocess([*base, f"trainer.max_steps={N}"], resumed)
    run_inprocess([*base, f"trainer.max_steps={2 * N}", "resume=auto"], resumed)
    _assert_same_final_state(straight, resumed, 2 * N)


def test_crash_then_resume_auto_continues_exactly(tmp_path):
    """The same command, interrupted after step N (its later checkpoint lost), then resume=auto."""
    cmd = [*GPT_RESUME, f"trainer.max_steps={2 * N}"]
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    run_inprocess(cmd, straight)
    run_inprocess(cmd, crashed)
    shutil.rmtree(crashed / "checkpoints" / f"step_{2 * N:06d}")
    run_inprocess([*cmd, "resume=auto"], crashed)
    _assert_same_final_state(straight, crashed, 2 * N)


def test_resume_across_an_epoch_boundary_with_ckpt_path(tmp_path):
    """Digits: 16 batches per epoch, accumulate=3 -> 6 steps per epoch (the last group short).
    The resume at step 5 is mid-epoch; the run continues through the boundaries into epoch 2."""
    base = [*DIGITS, "model.dropout=0.2", "trainer.accumulate=3", "trainer.val_every=4",
            "scheduler.total_steps=12", "callbacks.checkpoint.every_n_steps=5", "callbacks.checkpoint.keep_last_k=5"]
    straight, first = tmp_path / "straight", tmp_path / "first"
    run_inprocess([*base, "trainer.max_steps=12"], straight)
    run_inprocess([*base, "trainer.max_steps=5"], first)
    resumed = tmp_path / "second"
    run_inprocess([*base, "trainer.max_steps=12", f"ckpt_path={checkpoints(first)[-1]}"], resumed)
    _assert_same_final_state(straight, resumed, 12)
