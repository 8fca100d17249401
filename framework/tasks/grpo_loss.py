"""GRPO's arithmetic, as trl 1.16's GRPOTrainer does it: group-relative advantages from rewards, the
clipped per-token policy loss with its KL term, the four normalisations (`task.loss`), and the
metrics under trl's names. Pure tensor functions: the task (framework/tasks/grpo.py) feeds them, and
tests/tasks/test_grpo_equals_trl.py feeds trl's own `_compute_loss` the same tensors.

Shapes: N completions (a prompt's G = num_generations consecutive), T positions; `mask` (N, T) marks
the completion tokens scored; log-probabilities are per position, in float32.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

#: trl's loss types (GRPOConfig.loss_type) this task computes
LOSSES = ("grpo", "dr_grpo", "dapo", "bnpo")
SCALES = ("group", "batch", "none")
#: what trl adds to a reward's standard deviation before dividing by it
STD_FLOOR = 1e-4


def nanstd(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The standard deviation ignoring NaNs, with Bessel's correction (NaN below two values): trl's nanstd."""
    mean = torch.nanmean(values, dim=dim, keepdim=True)
    variance = torch.nanmean((values - mean) ** 2, dim=dim, keepdim=True)
    count = (~torch.isnan(values)).sum(dim=dim, keepdim=True)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(variance, float("nan")))
    std = torch.sqrt(variance * correction)
    return std.squeeze() if dim is None else std.squeeze(dim)


@dataclass(frozen=True)
class BatchMoments:
    """The non-NaN count, sum and sum of squares of every data-parallel rank's rewards in a step: what
    `scale_rewards=batch` and the logged `reward_std` need of the whole batch (one all-reduce)."""

    count: float
    total: float
    squares: float

    @staticmethod
    def local(rewards: torch.Tensor) -> torch.Tensor:
        """This rank's (count, sum, sum of squares), float64, to be summed over the ranks."""
        kept = rewards[~torch.isnan(rewards)].double()
        return torch.stack([torch.tensor(float(kept.numel()), dtype=torch.float64), kept.sum(), (kept * kept).sum()])

    @classmethod
    def of(cls, summed: torch.Tensor) -> "BatchMoments":
        count, total, squares = (float(v) for v in summed.cpu())
        return cls(count, total, squares)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")

    @property
    def std(self) -> float:
        """Bessel-corrected, as nanstd over the whole batch."""
        if self.count < 2:
            return float("nan")
        return max(self.squares - self.count * self.mean ** 2, 0.0) ** 0.5 / (self.count - 1) ** 0.5


@dataclass(frozen=True)
class StepTally:
    """What a step's logged values need of every data-parallel rank, summed in one all-reduce: the
    weighted rewards' and each function's moments, the completions, their lengths, the clipped ones,
    those whose scaling std is zero, the ranks, and each micro-batch's completion tokens."""

    reward: BatchMoments
    functions: list[BatchMoments]
    completions: float
    length: float
    clipped: float
    zero_std: float
    ranks: float
    tokens: list[float]

    @staticmethod
    def local(each: torch.Tensor, weighted: torch.Tensor, lengths: torch.Tensor, clipped: torch.Tensor,
              zero_std: torch.Tensor, tokens: list[int]) -> torch.Tensor:
        """This rank's part (float64), to be summed over the ranks: `each` (N, functions) and
        `weighted` (N,) rewards, the completions' `lengths` and `clipped` flags (N,), `zero_std` (N,),
        `tokens`: each micro-batch's completion tokens."""
        counts = torch.tensor([float(len(lengths)), float(lengths.sum()), float(clipped.sum()), float(zero_std.sum()),
                               1.0], dtype=torch.float64)
        return torch.cat([BatchMoments.local(weighted), *(BatchMoments.local(each[:, k]) for k in range(each.shape[1])),
                          counts, torch.tensor([float(t) for t in tokens], dtype=torch.float64)])

    @classmethod
    def of(cls, summed: torch.Tensor, functions: int) -> "StepTally":
        moments = [BatchMoments.of(summed[3 * i:3 * i + 3]) for i in range(functions + 1)]
        at = 3 * (functions + 1)
        completions, length, clipped, zero_std, ranks = summed[at:at + 5].tolist()
        return cls(moments[0], moments[1:], completions, length, clipped, zero_std, ranks, summed[at + 5:].tolist())

    def values(self, names: list[str]) -> dict[str, float]:
        """trl's names: the step's reward mean and std, each function's, frac_reward_zero_std and the
        completions' mean length and clipped share."""
        count = max(self.completions, 1.0)
        found = {"reward": self.reward.mean, "reward_std": self.reward.std, "frac_reward_zero_std": self.zero_std / count,
                 "completions/mean_length": self.length / count, "completions/clipped_ratio": self.clipped / count}
        for name, moments in zip(names, self.functions):
            found[f"rewards/{name}/mean"], found[f"rewards/{name}/std"] = moments.mean, moments.std
        return found


def advantages(rewards: torch.Tensor, generations: int, scale: str,
               batch: BatchMoments | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(each completion's advantage (N,), whether its scaling std is zero (N,): trl's
    frac_reward_zero_std) from its weighted reward (N,; NaN: unscorable): the reward minus its
    group's mean, divided by the group's std + 1e-4 (`group`), by the whole batch's (`batch`: the
    moments of every rank's rewards), or not at all (`none`); an unscorable completion's is 0."""
    grouped = rewards.view(-1, generations)
    centred = rewards - torch.nanmean(grouped, dim=1).repeat_interleave(generations)
    if scale == "batch":
        std = torch.full_like(rewards, batch.std if batch is not None else float(nanstd(rewards)))
    else:
        std = nanstd(grouped, dim=1).repeat_interleave(generations)
    scaled = centred if scale == "none" else centred / (std + STD_FLOOR)
    return torch.nan_to_num(scaled, nan=0.0), torch.isclose(std, torch.zeros_like(std))


@dataclass
class PolicyTerms:
    """The per-token loss and what the metrics read of it."""

    per_token: torch.Tensor
    """(N, T): -min(r A, clip(r) A) + beta KL."""
    ratio: torch.Tensor
    """(N, T): exp(logp - old logp), the importance weight."""
    kl: torch.Tensor | None
    """(N, T): exp(ref - logp) - (ref - logp) - 1, None with beta 0."""


def policy_terms(logps: torch.Tensor, old_logps: torch.Tensor, advantage: torch.Tensor, epsilon_low: float,
                 epsilon_high: float, beta: float, ref_logps: torch.Tensor | None) -> PolicyTerms:
    """trl's token-level clipped surrogate: r = exp(logp - old), -min(r A, clamp(r, 1 - eps_low,
    1 + eps_high) A), plus beta times the k3 estimate of the KL to the reference."""
    ratio = torch.exp(logps - old_logps)
    a = advantage.unsqueeze(1)
    per_token = -torch.min(ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
    kl = None
    if beta != 0.0:
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + beta * kl
    return PolicyTerms(per_token, ratio, kl)


def normalised(per_token: torch.Tensor, mask: torch.Tensor, loss: str, max_completion_tokens: int) -> torch.Tensor:
    """A micro-batch's loss before the loop's accumulation weighting, for the losses normalised by
    the micro-batch: `grpo` (each sequence's token mean, averaged), `bnpo` (over its tokens),
    `dr_grpo` (its sum over N x max_completion_tokens). `dapo` is a sum over the whole step's tokens
    (the loop's global count: framework/tasks/base.py training_sums), not this."""
    masked = per_token * mask
    if loss == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if loss == "dr_grpo":
        return masked.sum() / (per_token.shape[0] * max_completion_tokens)
    raise ValueError(f"normalised: {loss!r} is summed over the step, not normalised per micro-batch")


def clip_counts(terms: PolicyTerms, advantage: torch.Tensor, epsilon_low: float,
                epsilon_high: float) -> dict[str, torch.Tensor]:
    """(N, T) flags of the tokens clipped below (ratio under 1 - eps_low with A < 0), above (over
    1 + eps_high with A > 0), and either: trl's clip_ratio/low_mean, high_mean, region_mean."""
    a = advantage.unsqueeze(1)
    low = (terms.ratio < 1 - epsilon_low) & (a < 0)
    high = (terms.ratio > 1 + epsilon_high) & (a > 0)
    return {"clip_ratio/low_mean": low.float(), "clip_ratio/high_mean": high.float(),
            "clip_ratio/region_mean": (low | high).float()}


def entropy_of(logits: torch.Tensor) -> torch.Tensor:
    """Each position's entropy of softmax(logits) (..., V) -> (...), float32."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)
