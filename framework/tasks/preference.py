"""Preference tuning on chosen/rejected pairs (`task=preference`, data=preference_files): DPO and its
relatives, computed as trl 1.16's DPOTrainer computes them, so runs compare under its metric names.

A batch holds B pairs as 2B sequences, the chosen ones first (framework/data/preference_files.py),
run through the policy in one forward. A sequence's log-probability is the sum of its response
tokens' (the prompt and the padding are not scored); the reference's is computed the same way
under no_grad, every step (nothing cached: a resumed run needs no state of it), by a frozen model
the strategy places as it places the policy (framework/tasks/frozen.py), or with an adapter by the
policy with its adapters off. With π the policy's and ρ the reference's log-probabilities, and n a
response's token count:
- `sigmoid` (DPO): -log σ(β Δ), Δ = (π_c - ρ_c) - (π_r - ρ_r); with label_smoothing ε, conservative
  DPO: -(1 - ε) log σ(β Δ) - ε log σ(-β Δ) (trl 1.16 ignores ε for sigmoid; its earlier versions
  and this are cDPO);
- `ipo`: ((π_c - ρ_c) / n_c - (π_r - ρ_r) / n_r - 1 / (2 β))², trl's length-normalised IPO;
- `simpo`: reference-free: -(1 - ε) log σ(β (π_c / n_c - π_r / n_r) - γ) - ε log σ(-(...)), trl's
  CPO trainer's; no reference model is built.
The loss is the mean over the micro-batch's pairs. Logged beside it, as trl names them:
rewards/chosen and rewards/rejected (β times the log-ratio to the reference, or for simpo β times the
mean token log-probability), rewards/accuracies (the share of pairs whose chosen reward is higher),
rewards/margins, logps/chosen and logps/rejected (the policy's; for simpo per token). Validation
and `framework test` report the same over held-out pairs.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch
from torch.nn import functional as F

from framework.config.types import NonNegativeFloat, PositiveFloat, PositiveInt
from framework.errors import ConfigError
from framework.sequences import IGNORE_INDEX, next_token_targets
from framework.tasks.base import Task
from framework.tasks.second_model import FrozenSource, missing
from framework.tasks.token_logps import token_logps

LOSSES = ("sigmoid", "ipo", "simpo")
#: what a step logs and a validation reports, summed over pairs (each a mean of them in the end)
PAIR_VALUES = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
               "logps/rejected")


def sequence_logps(model, batch: Mapping, chunk_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(each sequence's summed log-probability of its scored tokens (N,), their number (N,)): the
    labels shifted by one (position t predicts token t + 1), in float32; the token log-probabilities
    of framework/tasks/token_logps.py (`chunk_tokens`: a chunk of positions at a time)."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    targets = next_token_targets(batch["labels"])
    return token_logps(model, inputs, targets, chunk_tokens).sum(-1), (targets != IGNORE_INDEX).sum(-1)


class Preference(Task):
    """DPO (sigmoid), IPO or SimPO over chosen/rejected pairs, against a frozen reference."""

    #: the batch kinds it reads (framework/data/batch_kinds.py)
    takes_batches = ("pairs",)

    throughput_unit = "tokens"
    frozen_model = True  # the reference (none with simpo)

    def __init__(self, loss: Literal["sigmoid", "ipo", "simpo"] = "sigmoid", beta: PositiveFloat = 0.1,
                 label_smoothing: NonNegativeFloat = 0.0, simpo_gamma: NonNegativeFloat = 0.5,
                 reference: str | None = None, disable_dropout: bool = True,
                 loss_chunk_tokens: PositiveInt | None = None):
        """loss: sigmoid (DPO), ipo or simpo (trl's names); beta: how far the policy may move from
        the reference (DPO's β; IPO's regularisation τ; SimPO's reward scale); label_smoothing: the
        share of pairs taken as mislabelled (conservative DPO, sigmoid and simpo), below 0.5;
        simpo_gamma: SimPO's target margin; reference: where the frozen reference comes from (null:
        the policy's initial weights, rebuilt on resume, never checkpointed, and with adapter=lora
        the policy with its adapters off; else a run directory, a checkpoint directory or a local
        Hugging Face model directory). simpo uses no reference; disable_dropout: every dropout
        layer of the policy at p=0 (trl's DPOConfig.disable_dropout, its default): the first step's
        loss is then ln 2 with zero rewards, as the log-probability ratios mean; false keeps the
        model's dropout in the policy (the reference computes without it all the same);
        loss_chunk_tokens: the policy's and the reference's token log-probabilities this many
        positions at a time through their output heads, never the whole logits (as the language
        model's task.loss_chunk_tokens; null: the whole logits)."""
        if loss not in LOSSES:
            raise ConfigError(f"task.loss={loss!r}: choose one of {', '.join(LOSSES)} (trl's names: sigmoid is DPO).")
        if not beta > 0:
            raise ConfigError(f"task.beta={beta}: must be above 0 (DPO's β: how far the policy may move from the "
                              "reference; 0.1 is trl's default).")
        if not 0 <= label_smoothing < 0.5:
            raise ConfigError(f"task.label_smoothing={label_smoothing}: must be at least 0 and below 0.5 (the share of "
                              "pairs taken as mislabelled).")
        if loss == "ipo" and label_smoothing:
            raise ConfigError("task.label_smoothing with task.loss=ipo: IPO's squared loss has no smoothed form; set "
                              "task.label_smoothing=0, or task.loss=sigmoid.")
        if loss == "simpo" and reference is not None:
            raise ConfigError(f"task.reference={reference} with task.loss=simpo: SimPO uses no reference model; set "
                              "task.reference=null, or task.loss=sigmoid.")
        self.loss, self.beta, self.label_smoothing, self.simpo_gamma = loss, float(beta), float(label_smoothing), \
            float(simpo_gamma)
        self.reference_path = reference
        self.disable_dropout = bool(disable_dropout)
        self.loss_chunk_tokens = loss_chunk_tokens

    # ---- the reference ----------------------------------------------------------------------------
    def frozen_source(self) -> FrozenSource | None:
        return None if self.loss == "simpo" else FrozenSource("task.reference", self.reference_path)

    def reference_logps(self, model, batch) -> torch.Tensor:
        """The reference's sequence log-probabilities (no gradient: framework/tasks/second_model.py)."""
        if self.frozen is None:
            raise missing("task.reference", "preference")
        with self.frozen.computing(model) as reference:
            return sequence_logps(reference, batch, self.loss_chunk_tokens)[0]

    # ---- the loss ---------------------------------------------------------------------------------
    def pair_losses(self, model, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(each pair's loss (B,), the values trl logs, each per pair (B,))."""
        logps, counts = sequence_logps(model, batch, self.loss_chunk_tokens)
        chosen, rejected = logps.chunk(2)
        n_chosen, n_rejected = (c.clamp(min=1) for c in counts.chunk(2))
        eps = self.label_smoothing
        if self.loss == "simpo":
            chosen_score, rejected_score = chosen / n_chosen, rejected / n_rejected
            margin = self.beta * (chosen_score - rejected_score) - self.simpo_gamma
            losses = -(1 - eps) * F.logsigmoid(margin) - eps * F.logsigmoid(-margin)
            chosen_rewards, rejected_rewards = self.beta * chosen_score, self.beta * rejected_score
            shown = chosen_score, rejected_score
        else:
            ref_chosen, ref_rejected = self.reference_logps(model, batch).chunk(2)
            chosen_ratio, rejected_ratio = chosen - ref_chosen, rejected - ref_rejected
            if self.loss == "ipo":
                losses = (chosen_ratio / n_chosen - rejected_ratio / n_rejected - 1 / (2 * self.beta)) ** 2
            else:
                delta = self.beta * (chosen_ratio - rejected_ratio)
                losses = -(1 - eps) * F.logsigmoid(delta) - eps * F.logsigmoid(-delta)
            chosen_rewards, rejected_rewards = self.beta * chosen_ratio, self.beta * rejected_ratio
            shown = chosen, rejected
        chosen_rewards, rejected_rewards = chosen_rewards.detach(), rejected_rewards.detach()
        values = {"rewards/chosen": chosen_rewards, "rewards/rejected": rejected_rewards,
                  "rewards/accuracies": (chosen_rewards > rejected_rewards).float(),
                  "rewards/margins": chosen_rewards - rejected_rewards,
                  "logps/chosen": shown[0].detach(), "logps/rejected": shown[1].detach()}
        return losses, values

    def training_step(self, model, batch) -> dict[str, torch.Tensor]:
        losses, values = self.pair_losses(model, batch)
        return {"loss": losses.mean(), **{k: v.mean() for k, v in values.items()}}

    def validation_step(self, model, batch) -> dict[str, torch.Tensor]:
        losses, values = self.pair_losses(model, batch)
        return {"loss_sum": losses.sum().double(), "pairs": torch.tensor(float(len(losses)), dtype=torch.float64,
                                                                          device=losses.device),
                **{k: v.sum().double() for k, v in values.items()}}

    def compute_metrics(self, sums) -> dict[str, float]:
        pairs = sums["pairs"].clamp(min=1)
        return {"loss": (sums["loss_sum"] / pairs).item(), **{k: (sums[k] / pairs).item() for k in PAIR_VALUES}}

    def batch_size(self, batch) -> int:
        """Tokens in the batch, both responses of every pair (padding included)."""
        return int(batch["input_ids"].numel())
