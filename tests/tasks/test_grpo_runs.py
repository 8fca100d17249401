"""task=grpo as a user runs it: generation inside the loop under every strategy that can run it, one
process equal to ddp, fsdp, deepspeed_stage_3 and model_parallel (tensor parallelism) at 2 processes
(the same prompts, completions, rewards, losses and weights), a resumed run sampling and training as
the straight run did, `framework test` on held-out prompts, and the refusals."""
from __future__ import annotations

import pytest
import torch

from framework.config.resolvers import example_data
from tests.conftest import checkpoint_at, load_model_state, metric_values, run_inprocess
from tests.helpers.run_cache import trained_run

GRPO = ["task=grpo", "data=prompt_files", f"data.files={example_data('arithmetic_prompts.jsonl')}",
        f"data.test_files={example_data('arithmetic_test.jsonl')}", "data.max_prompt_tokens=8",
        "model.n_layer=2", "model.n_embd=32", "model.n_head=2", "model.block_size=16", "model.dropout=0.0",
        "task.rewards=[exact_match,length]", "task.num_generations=4", "task.max_completion_tokens=4",
        "task.stop='\\n'", "optimizer.lr=0.003", "scheduler.warmup_steps=0", "trainer.max_steps=4",
        "trainer.val_every=2", "trainer.val_batches=2", "trainer.log_every=1", "trainer.progress_bar=false",
        "trainer.plot=false", "trainer.val_at_start=false", "seed=0", "callbacks=[checkpoint]",
        "callbacks.checkpoint.every_n_steps=2", "callbacks.checkpoint.keep_last_k=4",
        "callbacks.checkpoint.monitor=val/reward", "callbacks.checkpoint.mode=max"]
LAYOUTS = {"ddp": ["strategy=ddp", "devices=2", "data.batch_size=2"],
           "fsdp": ["strategy=fsdp", "devices=2", "data.batch_size=2"],
           "deepspeed_stage_3": ["strategy=deepspeed_stage_3", "devices=2", "data.batch_size=2"],
           # the tensor-parallel ranks read one batch together: the group's batch is the whole 4
           "model_parallel": ["strategy=model_parallel", "devices=2", "data.batch_size=4"]}
KEYS = ("train/loss", "train/reward", "train/reward_std", "train/rewards/length/mean", "train/entropy",
        "train/completions/mean_length", "train/clip_ratio/region_mean", "val/reward")


def one_process() -> object:
    return trained_run([*GRPO, "data.batch_size=4"])


def test_one_process_learns_from_the_rewards():
    run = one_process()
    rewards = metric_values(run, "train/reward")
    assert len(rewards) == 4 and len(set(rewards)) > 1  # each step's own completions
    assert any(abs(v) > 0 for v in metric_values(run, "train/loss"))  # advantages not all zero
    first, last = load_model_state(checkpoint_at(run, 2)), load_model_state(checkpoint_at(run, 4))
    assert any(not torch.equal(first[k], last[k]) for k in first)  # the policy moved


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_samples_and_trains_one_processs_numbers(layout):
    one, run = one_process(), trained_run([*GRPO, *LAYOUTS[layout]])
    for key in KEYS:
        got, want = metric_values(run, key), metric_values(one, key)
        assert len(got) == len(want) > 0, key
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-5, msg=key)
    final, straight = load_model_state(checkpoint_at(run, 4)), load_model_state(checkpoint_at(one, 4))
    assert set(final) == set(straight)
    for key, value in straight.items():
        torch.testing.assert_close(final[key], value, rtol=1e-5, atol=1e-5, msg=key)


def test_a_resumed_run_samples_and_trains_as_the_straight_run(tmp_path):
    straight = one_process()
    resumed = tmp_path / "resumed"
    run_inprocess([*GRPO, "data.batch_size=4", f"ckpt_path={checkpoint_at(straight, 2)}"], resumed)
    for key in ("train/loss", "train/reward", "train/completions/mean_length", "train/entropy"):
        assert metric_values(resumed, key) == metric_values(straight, key)[2:], key
    final, want = load_model_state(checkpoint_at(resumed, 4)), load_model_state(checkpoint_at(straight, 4))
    assert all(torch.equal(final[k], want[k]) for k in want)
