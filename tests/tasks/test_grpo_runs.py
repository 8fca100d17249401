"""task=grpo as a user runs it: generation inside the loop under every strategy that can run it, one
process equal to ddp, fsdp, deepspeed_stage_3 and model_parallel (tensor parallelism) at 2 processes
(the same prompts, completions, rewards, losses and weights), a resumed run sampling and training as
the straight run did, `framework test` on held-out prompts, and the refusals."""
from __future__ import annotations

import pytest
import torch

from framework.config.resolvers import example_data
from tests.conftest import checkpoint_at, load_model_state, metric_values, run_inprocess
from tests.helpers.layouts import FOUR_LOGGED_STEPS, ONE_PROCESS, TWO_LAYER_GPT, TWO_PROCESS_LAYOUTS
from tests.helpers.run_cache import trained_run

GRPO = ["task=grpo", "data=prompt_files", f"data.files={example_data('arithmetic_prompts.jsonl')}",
        f"data.test_files={example_data('arithmetic_test.jsonl')}", "data.max_prompt_tokens=8", *TWO_LAYER_GPT,
        "model.block_size=16", "task.rewards=[exact_match,length]", "task.num_generations=4",
        "task.max_completion_tokens=4", "task.stop='\\n'", "optimizer.lr=0.003", "scheduler.warmup_steps=0",
        "trainer.val_batches=2", *FOUR_LOGGED_STEPS, "callbacks.checkpoint.monitor=val/reward",
        "callbacks.checkpoint.mode=max"]
LAYOUTS = TWO_PROCESS_LAYOUTS
KEYS = ("train/loss", "train/reward", "train/reward_std", "train/rewards/length/mean", "train/entropy",
        "train/completions/mean_length", "train/clip_ratio/region_mean", "val/reward")


def one_process() -> object:
    return trained_run([*GRPO, *ONE_PROCESS])


def test_one_process_learns_from_the_rewards():
    run = one_process()
    rewards = metric_values(run, "train/reward")
    assert len(rewards) == 4 and len(set(rewards)) > 1  # each step's own completions
    assert any(abs(v) > 0 for v in metric_values(run, "train/loss"))  # advantages not all zero
    # validation: completions of 1 to 4 tokens, and the `length` reward's own mean (negative) beside it
    lengths, length_rewards = metric_values(run, "val/completions/mean_length"), metric_values(run, "val/rewards/length/mean")
    assert lengths and all(1 <= v <= 4 for v in lengths) and all(v < 0 for v in length_rewards)
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
    run_inprocess([*GRPO, *ONE_PROCESS, f"ckpt_path={checkpoint_at(straight, 2)}"], resumed)
    for key in ("train/loss", "train/reward", "train/completions/mean_length", "train/entropy"):
        assert metric_values(resumed, key) == metric_values(straight, key)[2:], key
    final, want = load_model_state(checkpoint_at(resumed, 4)), load_model_state(checkpoint_at(straight, 4))
    assert all(torch.equal(final[k], want[k]) for k in want)


def test_num_iterations_trains_each_rollout_again_and_a_resume_between_them_goes_on_with_it(tmp_path):
    """task.num_iterations=2: each batch of completions trains two optimizer steps (the same rewards
    logged twice, the second step's ratios off 1); a checkpoint between the two keeps the batch, and
    the run resumed from it trains the second step as the straight run did."""
    overrides = [*GRPO, *ONE_PROCESS, "task.num_iterations=2", "callbacks.checkpoint.every_n_steps=1"]
    straight = trained_run(overrides)
    rewards = metric_values(straight, "train/reward")
    assert len(rewards) == 4 and rewards[0] == rewards[1] and rewards[2] == rewards[3] and rewards[0] != rewards[2]
    resumed = tmp_path / "resumed"
    run_inprocess([*overrides, f"ckpt_path={checkpoint_at(straight, 1)}"], resumed)
    for key in ("train/loss", "train/reward", "train/clip_ratio/region_mean", "train/entropy"):
        assert metric_values(resumed, key) == metric_values(straight, key)[1:], key
    final, want = load_model_state(checkpoint_at(resumed, 4)), load_model_state(checkpoint_at(straight, 4))
    assert all(torch.equal(final[k], want[k]) for k in want)


def hub_llama(tiny_llama) -> list[str]:
    """GRPO on a pretrained Hugging Face Llama with a reference (beta > 0): a frozen second model
    loaded from the same weights, and completions decoded with transformers' own cache."""
    return ["model=hf_causal_lm", "model.config=null", f"model.pretrained={tiny_llama}",
            *[o for o in GRPO if not o.startswith("model.")], "task.beta=0.04",
            # its random bytes: a completion holding a lowercase letter is rewarded (about a third are)
            "task.rewards=[{_target_:framework.tasks.rewards.Format,pattern:'(?s).*[a-z].*'}]",
            "trainer.max_steps=2", "callbacks.checkpoint.every_n_steps=1"]


def test_a_hugging_face_model_samples_with_its_own_cache_and_trains(tiny_llama):
    """A Hugging Face causal LM: its completions are scored and its weights move, the reference
    (beta > 0) its own initial weights."""
    run = trained_run([*hub_llama(tiny_llama), *ONE_PROCESS])
    kl = metric_values(run, "train/kl")
    assert kl[0] == 0 and kl[1] > 0  # the policy left its reference after the first step
    assert len(set(metric_values(run, "train/reward"))) == 2
    first, last = load_model_state(checkpoint_at(run, 1)), load_model_state(checkpoint_at(run, 2))
    assert any(not torch.equal(first[k], last[k]) for k in first)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["fsdp", "deepspeed_stage_3", "model_parallel"])
def test_a_hugging_face_model_and_its_reference_train_one_processs_numbers_when_sharded(tiny_llama, layout):
    """The pretrained weights loaded into each rank's part of both models (ZeRO-3's frozen model
    has no optimizer to hold master weights), transformers' cache holding a rank's heads under
    tensor parallelism, and its attention's per-instance state kept in a model built after another
    under ZeRO-3's partitioned init (framework/strategy/deepspeed/base.py build_model)."""
    one, run = trained_run([*hub_llama(tiny_llama), *ONE_PROCESS]), trained_run([*hub_llama(tiny_llama),
                                                                                  *LAYOUTS[layout]])
    for key in ("train/loss", "train/reward", "train/kl", "train/entropy"):
        got, want = metric_values(run, key), metric_values(one, key)
        assert len(got) == len(want) == 2, key
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-5, msg=key)
    assert metric_values(run, "train/kl")[1] > 0


@pytest.mark.slow
def test_the_pages_commands_run_as_written(tmp_path):
    """docs/grpo.md's commands, each as typed (stage 1's run cut to 6 steps, so stage 2 starts from
    its step 6; stage 2 cut to 2 steps): SFT, GRPO from its weights on one process and under fsdp,
    the held-out test, the plan."""
    from tests.helpers.in_process import run_command
    from tests.test_docs import section_commands

    commands = section_commands("Reinforcement learning from rewards: GRPO")
    assert [c.split()[1] for c in commands] == ["run", "run", "run", "test", "plan"]
    short = {"grpo_arithmetic_sft": ["trainer.max_steps=6", "trainer.val_every=6", "trainer.val_batches=1"],
             # the held-out test: by the `framework test` command below, once
             "grpo_arithmetic": ["trainer.max_steps=2", "trainer.val_every=2", "trainer.val_batches=1",
                                 "trainer.log_every=1", "trainer.test_at_end=false"]}
    for command in commands:
        args = [a.replace("step_000500", "step_000006") for a in command.split()[1:]]
        extra = short.get(args[1], []) if args[0] == "run" else []
        result = run_command([*args, *extra, *(["trainer.plot=false"] if args[0] == "run" else [])], tmp_path)
        assert result.returncode == 0, (command, result.stderr[-3000:])
        if args[0] == "plan":
            assert "task.reference: a frozen second model of" in result.stdout and "task.rollout:" in result.stdout
    one, fsdp = tmp_path / "outputs" / "arith_grpo", tmp_path / "outputs" / "arith_fsdp"
    assert (one / "test_metrics.json").is_file()  # `framework test` of the run
    torch.testing.assert_close(torch.tensor(metric_values(fsdp, "train/loss")),
                               torch.tensor(metric_values(one, "train/loss")), rtol=1e-5, atol=1e-5)
