"""task=grpo's loss, advantages and metrics against trl 1.16's GRPOTrainer on the same completions:
trl's own `_compute_loss` is called (on a stand-in for the trainer that holds the attributes it
reads, and computes the per-token log-probabilities and entropies as trl's fused head does: the
logits / temperature, log-softmax at each completion token), for each loss type, beta 0 and > 0,
num_iterations 1 and 2, with the GPT's dropout on (each forward seeded alike, on inputs of one shape).
The advantages and reward metrics follow trl's `_generate_and_score_completions` (its nanstd)."""
from __future__ import annotations

import copy
import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from framework.models.gpt import GPT
from framework.tasks import grpo_loss as G
from framework.tasks.grpo import GRPO
from framework.tasks.rollout import Group
from framework.tasks.second_model import Frozen

trl = pytest.importorskip("trl")
from trl.trainer.grpo_trainer import GRPOTrainer  # noqa: E402
from trl.trainer.utils import nanstd as trl_nanstd  # noqa: E402

TEMPERATURE = 0.7
MAX_COMPLETION = 5
PROMPTS = [[ord(c) for c in "1+2="], [ord(c) for c in "3+4="]]  # one length: trl's left padding adds none
ANSWERS = ["3", "7"]
# each prompt's 4 completions (byte ids; "\n" ends one, the last runs to MAX_COMPLETION)
COMPLETIONS = [["3\n", "4\n", "3\n", "12345"], ["7\n", "7\n", "8\n", "77\n"]]


def _model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(vocab_size=256, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.1)


def _task(**kwargs) -> GRPO:
    settings = {"tokenizer": "bytes", "rewards": ["exact_match", "length"], "reward_weights": [1.0, 0.5],
                "num_generations": 4, "max_completion_tokens": MAX_COMPLETION, "temperature": TEMPERATURE,
                "stop": "\n"}
    return GRPO(**{**settings, **kwargs})


def _prompt_batch() -> dict:
    return {"prompt_ids": torch.tensor(PROMPTS), "prompt_lengths": torch.tensor([len(p) for p in PROMPTS]),
            "index": torch.tensor([0, 1]), "prompts": ["1+2=", "3+4="],
            "rows": [{"answer": a, "__row__": f"line {i + 1}"} for i, a in enumerate(ANSWERS)]}


def _groups() -> list:
    found = []
    for prompt, texts in zip(PROMPTS, COMPLETIONS):
        ids = [[ord(c) for c in t] for t in texts]
        found.append((prompt, Group(ids, [not t.endswith("\n") for t in texts])))
    return [found]


class TrlStandIn:
    """What GRPOTrainer._compute_loss reads of its trainer, at one process and no accumulation."""

    def __init__(self, model, loss_type: str, beta: float, epsilon: float, epsilon_high: float):
        self.model, self.loss_type, self.beta = model, loss_type, beta
        self.epsilon_low, self.epsilon_high = epsilon, epsilon_high
        self.top_entropy_quantile, self.off_policy_mask_threshold = 1.0, None
        self.importance_sampling_level, self.use_vllm, self.vllm_importance_sampling_correction = "token", False, False
        self._entropy_bonus_enabled, self.aux_loss_enabled = False, False
        self.current_gradient_accumulation_steps, self.max_completion_length = 1, MAX_COMPLETION
        self.args = SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1)
        self.accelerator = SimpleNamespace(num_processes=1, gather=lambda x: x, gather_for_metrics=lambda x: x,
                                           reduce=lambda x, reduction="sum": x)
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                           compute_entropy=False, **_):
        logits = model(input_ids=input_ids)[:, -logits_to_keep - 1:-1].float() / TEMPERATURE
        logp = logits.log_softmax(-1)
        picked = logp.gather(-1, input_ids[:, -logits_to_keep:].unsqueeze(-1)).squeeze(-1)
        entropy = -(logp.exp() * logp).sum(-1) if compute_entropy else None
        return picked, entropy, None


def _trl_inputs(rolled: dict, advantages: torch.Tensor) -> dict:
    """trl's inputs for the same rows: prompts (one length), completions right-padded."""
    width = len(PROMPTS[0])
    ids = rolled["input_ids"]
    completion_mask = (rolled["targets"][:, width - 1:-1] != -100).long()
    return {"prompt_ids": ids[:, :width], "prompt_mask": torch.ones_like(ids[:, :width]),
            "completion_ids": ids[:, width:], "completion_mask": completion_mask, "advantages": advantages,
            "num_items_in_batch": completion_mask.sum()}


def _completion_part(per_position: torch.Tensor) -> torch.Tensor:
    width = len(PROMPTS[0])
    return per_position[:, width - 1:-1]


def _seeded(fn, seed: int = 7):
    torch.manual_seed(seed)
    return fn()


@pytest.mark.parametrize("loss", ["grpo", "dr_grpo", "dapo", "bnpo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("iterations", [1, 2])
def test_loss_gradients_and_metrics_equal_trls_compute_loss(loss, beta, iterations):
    model = _model()
    model.train()
    reference = _model(seed=1).eval()  # another model's weights: the KL term is not zero
    task = _task(loss=loss, beta=beta, num_iterations=iterations, epsilon=0.2, epsilon_high=0.28)
    if beta:
        task.use_frozen(Frozen("task.reference", reference))
    rolled = _seeded(lambda: task.from_completions(model, [_prompt_batch()], _groups()))[0]
    if iterations > 1:  # the update between sampling and this step: the ratios move off 1, some clipped
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
    stand_in = TrlStandIn(model, loss, beta, 0.2, 0.28)
    inputs = _trl_inputs(rolled, rolled["advantages"])
    if iterations > 1:
        inputs["old_per_token_logps"] = _completion_part(rolled["old_logps"])
    if beta:
        theirs_ref = stand_in._get_per_token_logps_and_entropies(reference, torch.cat(
            [inputs["prompt_ids"], inputs["completion_ids"]], 1), None, inputs["completion_ids"].shape[1])[0]
        mask = inputs["completion_mask"].bool()
        assert torch.allclose(_completion_part(rolled["ref_logps"])[mask], theirs_ref[mask], atol=1e-5)
        inputs["ref_per_token_logps"] = theirs_ref

    theirs = _seeded(lambda: GRPOTrainer._compute_loss(stand_in, model, inputs))
    theirs.backward()
    their_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    if loss == "dapo":  # summed over the step's tokens (the loop divides by their count: one process here)
        total, count, values = _seeded(lambda: task.training_sums(model, rolled))
        ours = total / count
    else:
        out = _seeded(lambda: task.training_step(model, rolled))
        ours, values = out["loss"], out
    ours.backward()
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), abs=1e-5)
    for mine, their in zip((p.grad for p in model.parameters()), their_grads):
        assert torch.allclose(mine, their, atol=1e-5)
    for name, logged in stand_in._metrics["train"].items():
        if name == "policy_loss" or name.endswith(("_min", "_max")):
            continue
        assert float(values[name]) == pytest.approx(logged[0], abs=1e-5), name
    assert ("kl" in values) == bool(beta)
    if iterations > 1:
        assert float(values["clip_ratio/region_mean"]) > 0  # the clipping was exercised


def _trl_advantages(rewards_per_func: torch.Tensor, weights: torch.Tensor, generations: int, scale: str):
    """trl 1.16 _generate_and_score_completions' sum_then_normalize, line by line."""
    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable] = torch.nan
    mean_grouped = torch.nanmean(rewards.view(-1, generations), dim=1).repeat_interleave(generations)
    if scale in ("group", "none"):
        std = trl_nanstd(rewards.view(-1, generations), dim=1).repeat_interleave(generations)
    else:
        std = trl_nanstd(rewards).expand_as(rewards)
    advantages = rewards - mean_grouped
    if scale != "none":
        advantages = advantages / (std + 1e-4)
    zero_std = torch.isclose(std, torch.zeros_like(std))
    metrics = {"reward": torch.nanmean(rewards).item(), "reward_std": trl_nanstd(rewards).item(),
               "frac_reward_zero_std": zero_std.float().mean().item()}
    return torch.nan_to_num(advantages, nan=0.0), metrics


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_and_reward_metrics_equal_trls(scale):
    model = _model().train()
    task = _task(scale_rewards=scale)
    rolled = task.from_completions(model, [_prompt_batch()], _groups())[0]
    each = torch.tensor([[1.0 if t.split("\n")[0] == a else 0.0 for t in texts] for texts, a in
                         zip(COMPLETIONS, ANSWERS)]).reshape(-1)
    lengths = torch.tensor([-abs(len(t) - 64) / 64 for texts in COMPLETIONS for t in texts])
    theirs, metrics = _trl_advantages(torch.stack([each, lengths], 1), torch.tensor([1.0, 0.5]), 4, scale)
    assert torch.allclose(rolled["advantages"], theirs, atol=1e-5)
    for name, value in metrics.items():
        assert rolled["step_values"][name] == pytest.approx(value, abs=1e-5), name
    assert rolled["step_values"]["rewards/exact_match/mean"] == pytest.approx(each.mean().item())
    assert rolled["step_values"]["completions/clipped_ratio"] == pytest.approx(1 / 8)
    assert rolled["step_values"]["completions/mean_length"] == pytest.approx(
        sum(len(t) for texts in COMPLETIONS for t in texts) / 8)


def test_a_completion_no_function_scores_has_no_advantage_and_none_counts_as_nan():
    """A reward function's None is NaN (trl's): a completion every function leaves unscored gets
    advantage 0 and stays out of its group's mean."""
    rewards = torch.tensor([1.0, float("nan"), 0.0, 1.0])
    advantages, _ = G.advantages(rewards, 4, "group")
    assert advantages[1] == 0
    mean = (1.0 + 0.0 + 1.0) / 3
    std = math.sqrt(((1 - mean) ** 2 * 2 + mean ** 2) / 2)
    assert float(advantages[0]) == pytest.approx((1 - mean) / (std + 1e-4), abs=1e-6)


def test_batch_moments_give_the_whole_batchs_std_as_nanstd_does():
    values = torch.tensor([0.5, float("nan"), 2.0, -1.0, 3.25], dtype=torch.float64)
    halves = [G.BatchMoments.local(values[:2]), G.BatchMoments.local(values[2:])]
    moments = G.BatchMoments.of(halves[0] + halves[1])  # summed over two "ranks"
    assert moments.std == pytest.approx(float(trl_nanstd(values)), abs=1e-7)  # trl's Bessel factor is float32
    assert moments.mean == pytest.approx(float(torch.nanmean(values)), abs=1e-9)


def test_the_reference_is_the_policys_frozen_copy_and_never_trains():
    model = _model().train()
    task = _task(beta=0.1)
    task.use_frozen(Frozen("task.reference", copy.deepcopy(model).eval()))
    rolled = _seeded(lambda: task.from_completions(model, [_prompt_batch()], _groups()))[0]
    assert not rolled["ref_logps"].requires_grad
    out = _seeded(lambda: task.training_step(model, rolled))
    assert float(out["kl"]) >= 0
