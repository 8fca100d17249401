"""What a model's routing layers show the layout that places them: the contract between a mixture
of experts (the built-in GPT's, framework/models/moe.py, or a Hugging Face model's routers watched,
framework/models/hf_routers.py) and the strategy that spreads its experts and counts its tokens
(framework/strategy/mesh/experts.py). The strategy sits below the models, so it finds these layers
by these classes, not by probing attributes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class RouterRecord:
    """What one micro-batch's routing left for the losses and the metrics."""

    balance: torch.Tensor  # num_experts x sum_e f_e x (sum of this rank's P_e over its tokens)
    z: torch.Tensor  # sum over this rank's tokens of logsumexp(logits)^2
    tokens: int  # this rank's tokens
    counts: torch.Tensor  # routed tokens per expert, over the token group (float64, no grad)
    dropped: torch.Tensor  # the fraction of routed token-slots the capacity dropped, over the token group


class Routed(nn.Module):
    """A module that routes tokens to experts and keeps, from its last training forward, what the
    losses and the metrics read. The layout sets `token_group`, the ranks its tokens are counted
    over ("default": every rank; None: this rank alone; else a process group: the data-parallel
    ranks where tensor ranks or stages compute the same tokens), and `counting`, whether a training
    forward counts its tokens for a balancing that moves between steps (a pipeline's shape inference
    does not)."""

    record: RouterRecord | None = None
    layer: int = 0  # the Block it is in: its metrics are named by it
    token_group = "default"
    counting = True

    def losses(self, summed: bool) -> torch.Tensor | None:
        """The weighted losses of the last training forward: summed over this rank's tokens (to be
        divided as the task's summed loss is), or as means over them; None (this default): the
        module routes but adds no loss of its own."""
        return None

    def loads(self) -> list[tuple[int, torch.Tensor]]:
        """(the layer's index, its tokens per expert over the token group) for each layer it routes."""
        return [(self.layer, self.record.counts)] if self.record is not None else []


class StackedExperts(nn.Module):
    """`num_experts` experts whose weights (`WEIGHTS`) are stacked on a first dimension of experts,
    so expert parallelism splits them along it; `group` is the process group its tokens are
    dispatched over (None: every expert on this rank)."""

    WEIGHTS: tuple[str, ...] = ()
    num_experts: int = 0
    active_fraction: float = 1.0  # the share of the experts one token goes through
    group = None

    def weights(self) -> list[nn.Parameter]:
        return [getattr(self, name) for name in self.WEIGHTS]


class ExpertLayer(Routed):
    """A routing layer that computes its own experts (`experts`, stacked): the layout may spread
    them over expert-parallel ranks."""

    experts: StackedExperts
