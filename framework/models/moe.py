"""Mixture-of-experts layers for the built-in GPT: a router picks `top_k` of `num_experts` MLPs
for each token, the chosen experts' outputs are added weighted by the router's scores.

Dropless by default: every routed token is computed (tokens are sorted by expert and each expert
runs on its own slice, so no capacity is padded or dropped). A capacity factor is an option: each
expert then takes at most ceil(factor x tokens x top_k / num_experts) of a micro-batch's tokens on
each rank, in token order, and the rest of its tokens skip it (counted as dropped).

Balancing, as the anchors do it:
- `balance=loss`: the auxiliary loss of Switch/GShard, num_experts x sum_e f_e x P_e, where f_e is
  the fraction of routed tokens that chose expert e and P_e the mean router probability of e. f is
  counted over the micro-batch of every data-parallel rank (one all-reduce of num_experts counts),
  P summed over this rank's tokens and divided as the language-model loss is, so the loss and its
  gradient are those of the global batch whatever the layout (under pipeline stages, each
  microbatch's: framework/models/stage_routing.py).
- `balance=bias`: DeepSeek-V3's balancing without an auxiliary loss: a per-expert bias added to
  the scores when choosing experts (not when weighting them), moved by `bias_rate` after every
  optimizer step towards the experts that got fewer tokens (counted over the step's global batch).
- `z_loss_coef`: the router z-loss of ST-MoE (the squared log-sum-exp of the router's logits),
  which keeps the logits small.

Expert parallelism (framework/strategy/mesh/experts.py) hands a layer its groups: the ranks the
tokens are counted over (`token_group`) and the ranks the experts are spread over; tokens then go
to the rank holding their expert and back with all-to-all (torch's functional collectives).
"""
from __future__ import annotations

import math
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd  # 19 ms with torch loaded
from torch.nn import functional as F

from framework.config.types import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from framework.construction.routing import ExpertLayer, RouterRecord, StackedExperts
from framework.errors import ConfigError


class MoESettings:
    """`model.moe`: which Blocks are mixtures of experts and how they route (conf/model/gpt.yaml)."""

    def __init__(self, num_experts: NonNegativeInt = 0, top_k: PositiveInt = 2, layers: list[int] | None = None,
                 shared_experts: NonNegativeInt = 0, expert_hidden: PositiveInt | None = None,
                 score: Literal["softmax", "sigmoid"] = "softmax", normalize_weights: bool = True,
                 capacity_factor: PositiveFloat | None = None, balance: Literal["loss", "bias", "none"] = "loss",
                 balance_coef: NonNegativeFloat = 0.01, bias_rate: NonNegativeFloat = 0.001,
                 z_loss_coef: NonNegativeFloat = 0.0):
        """num_experts: routed experts per MoE layer (0: every Block dense, the model of before);
        top_k: experts per token; layers: the Blocks that are MoE (null: all); shared_experts: experts
        every token goes through besides the routed ones (DeepSeek); expert_hidden: an expert's hidden
        width (null: 4 x n_embd, the dense MLP's); score: softmax over the experts, or sigmoid per
        expert (DeepSeek-V3); normalize_weights: the chosen experts' weights rescaled to sum to 1;
        capacity_factor: null is dropless, else each expert's share of a micro-batch's routed tokens
        (x tokens x top_k / num_experts) beyond which tokens skip it; balance: loss (auxiliary),
        bias (DeepSeek-V3, no auxiliary loss) or none; balance_coef: the auxiliary loss's weight;
        bias_rate: how far a step moves the balancing bias; z_loss_coef: the router z-loss's weight."""
        if num_experts and top_k > num_experts:
            raise ConfigError(f"model.moe.top_k={top_k} is more than model.moe.num_experts={num_experts}; choose "
                              "top_k <= num_experts.")
        self.num_experts, self.top_k = num_experts, top_k
        self.layers = None if layers is None else [int(i) for i in layers]
        self.shared_experts, self.expert_hidden = shared_experts, expert_hidden
        self.score, self.normalize_weights = score, normalize_weights
        self.capacity_factor = capacity_factor
        self.balance, self.balance_coef, self.bias_rate = balance, balance_coef, bias_rate
        self.z_loss_coef = z_loss_coef

    @property
    def enabled(self) -> bool:
        return self.num_experts > 0

    def is_moe(self, layer: int, n_layer: int) -> bool:
        if self.layers is not None:
            bad = [i for i in self.layers if not 0 <= i < n_layer]
            if bad:
                raise ConfigError(f"model.moe.layers={self.layers}: {bad} not among the model's Blocks 0..{n_layer - 1};"
                                  " list Block indices, or null for every Block.")
        return self.enabled and (self.layers is None or layer in self.layers)

    @property
    def adds_loss(self) -> bool:
        """Whether the layers add losses of their own to the task's (balancing, z-loss)."""
        return self.enabled and ((self.balance == "loss" and self.balance_coef > 0) or self.z_loss_coef > 0)


class Experts(StackedExperts):
    """`num_experts` two-layer GELU MLPs, their weights stacked on a first dimension of experts (so
    expert parallelism splits them along it). Under expert parallelism this rank holds experts
    [first, first + local) and `group` is the expert-parallel process group."""

    WEIGHTS = ("w1", "b1", "w2", "b2")

    def __init__(self, num_experts: int, n_embd: int, hidden: int, top_k: int):
        super().__init__()
        self.num_experts = num_experts
        #: the share of the experts one token goes through (FLOPs and `plan` count active parameters)
        self.active_fraction = top_k / num_experts
        self.w1 = nn.Parameter(torch.empty(num_experts, n_embd, hidden))
        self.b1 = nn.Parameter(torch.empty(num_experts, hidden))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden, n_embd))
        self.b2 = nn.Parameter(torch.empty(num_experts, n_embd))
        for weight in (self.w1, self.w2):
            nn.init.normal_(weight, mean=0.0, std=0.02)
        for bias in (self.b1, self.b2):
            nn.init.zeros_(bias)

    def run_local(self, tokens: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Each local expert on its slice of `tokens` (sorted by expert, `counts` each)."""
        # in the tokens' dtype: under FSDP's mixed precision the spread experts, which FSDP leaves
        # alone, are not cast for compute as the layers around them are
        w1, b1, w2, b2 = (_local(p).to(tokens.dtype) for p in (self.w1, self.b1, self.w2, self.b2))
        outputs = [F.gelu(chunk @ w1[e] + b1[e]) @ w2[e] + b2[e]
                   for e, chunk in enumerate(tokens.split(counts)) if chunk.shape[0]]
        if outputs:
            return torch.cat(outputs)
        # no token for any of this rank's experts: an (empty) output still joined to the tokens and
        # to every weight, so that this rank's backward runs the same all-to-alls as its peers' and
        # its experts get a (zero) gradient like every rank's
        return tokens * 0 + sum(p.sum() for p in (w1, b1, w2, b2)) * 0

    def forward(self, tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """`tokens` sorted by expert, `counts` (num_experts,) of them per expert; the outputs in the
        same order. With an expert-parallel group the tokens travel to their expert's rank and back."""
        if self.group is None:
            return self.run_local(tokens, counts.tolist())
        return _exchange(self, tokens, counts)


def _local(param: torch.Tensor) -> torch.Tensor:
    """A parameter's local part (a DTensor's shard under expert parallelism)."""
    return param.to_local() if hasattr(param, "to_local") else param


def _exchange(experts: Experts, tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Dispatch with all-to-all to the ranks holding each expert, compute, and combine back."""
    group, ranks = experts.group, dist.get_world_size(experts.group)
    local = experts.num_experts // ranks
    sent = counts.to(torch.int64).view(ranks, local)
    received = torch.empty_like(sent)
    dist.all_to_all_single(received, sent, group=group)  # tokens each source sends to each of my experts
    send_splits, recv_splits = sent.sum(1).tolist(), received.sum(1).tolist()
    arrived = all_to_all_single_autograd(tokens, recv_splits, send_splits, group)
    # arrived is grouped by source, then expert; the experts want it grouped by expert, then source
    sizes = received.flatten().tolist()
    starts = [0] + list(torch.tensor(sizes).cumsum(0)[:-1].tolist())
    order = [torch.arange(starts[s * local + e], starts[s * local + e] + sizes[s * local + e])
             for e in range(local) for s in range(ranks)]
    order = torch.cat(order).to(tokens.device) if order else torch.zeros(0, dtype=torch.long, device=tokens.device)
    computed = experts.run_local(arrived[order], received.sum(0).tolist())
    back = torch.empty_like(computed).index_copy(0, order, computed)
    return all_to_all_single_autograd(back, send_splits, recv_splits, group)


class MoE(ExpertLayer):
    """The routed experts (and shared ones) in place of a Block's MLP."""

    def __init__(self, n_embd: int, settings: MoESettings, dropout: float, layer: int = 0):
        super().__init__()
        self.settings = settings
        self.layer = layer  # the Block it is in: its metrics are named by it
        hidden = settings.expert_hidden or 4 * n_embd
        self.router = nn.Linear(n_embd, settings.num_experts, bias=False)
        if settings.balance == "bias":  # saved with the model; initialised as a meta build can replay
            self.register_buffer("expert_bias", nn.init.zeros_(torch.empty(settings.num_experts)))
        self.step_counts: torch.Tensor | None = None  # bias balancing: the step's tokens per expert so far
        self.experts = Experts(settings.num_experts, n_embd, hidden, settings.top_k)
        self.shared = (nn.Sequential(nn.Linear(n_embd, hidden * settings.shared_experts), nn.GELU(),
                                     nn.Linear(hidden * settings.shared_experts, n_embd))
                       if settings.shared_experts else None)
        self.drop = nn.Dropout(dropout)
        self.record: RouterRecord | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, shape = self.settings, x.shape
        x = x.reshape(-1, shape[-1])
        n, k = x.shape[0], s.top_k
        logits = self.router(x).float()
        scores = logits.softmax(dim=-1) if s.score == "softmax" else logits.sigmoid()
        choosing = scores + self.expert_bias if s.balance == "bias" else scores
        chosen = choosing.topk(k, dim=-1).indices  # (n, k)
        weights = scores.gather(-1, chosen)
        if s.normalize_weights:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        flat = chosen.flatten()
        order = flat.argsort(stable=True)  # token-slots sorted by expert, in token order within one
        counts = torch.bincount(flat, minlength=s.num_experts)
        kept = order
        if s.capacity_factor is not None:
            kept, counts = _within_capacity(order, flat, counts, math.ceil(s.capacity_factor * n * k / s.num_experts))
        tokens = kept // k
        out = self.experts(x[tokens], counts) * weights.flatten()[kept, None].to(x.dtype)
        y = torch.zeros_like(x).index_add(0, tokens, out)
        if self.shared is not None:
            y = y + self.shared(x)
        if self.training and torch.is_grad_enabled():  # not a pipeline's shape inference (no_grad) either
            # an activation checkpoint's recompute (inside backward) repeats the differentiable part
            # (the checkpoint compares what forward saved) but counts nothing again
            recompute = torch._C._current_graph_task_id() != -1 and self.record is not None
            record = self._routing_record(logits, scores, chosen, n, int(flat.numel() - kept.numel()),
                                          self.record.counts if recompute else None)
            if not recompute:
                self.record = record
        return self.drop(y).view(shape)

    def _routing_record(self, logits, scores, chosen, n: int, dropped: int,
                        counted: torch.Tensor | None = None) -> RouterRecord:
        """The losses' parts and the statistics; `counted`: the global counts already taken (a
        recompute), else counted over the token group here."""
        s = self.settings
        if counted is None:
            routed = torch.bincount(chosen.flatten(), minlength=s.num_experts).double()
            totals = torch.cat([routed, routed.new_tensor([float(n), float(dropped)])])
            group = self._group()
            if group is not None:
                dist.all_reduce(totals, group=group)
            if s.balance == "bias" and self.counting:
                self.step_counts = totals[:-2] if self.step_counts is None else self.step_counts + totals[:-2]
        else:
            totals = torch.cat([counted, counted.new_tensor([counted.sum() / s.top_k, 0.0])])
        counts, tokens, dropped_all = totals[:-2], totals[-2], totals[-1]
        fraction = (counts / (tokens * s.top_k)).float()  # f_e over the global micro-batch
        probabilities = scores if s.score == "softmax" else scores / scores.sum(dim=-1, keepdim=True)
        balance = s.num_experts * (fraction * probabilities.sum(dim=0)).sum()
        z = torch.logsumexp(logits, dim=-1).pow(2).sum()
        return RouterRecord(balance, z, n, counts, dropped_all / (tokens * s.top_k))

    def _group(self):
        if self.token_group != "default":
            return self.token_group
        return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None

    def losses(self, summed: bool) -> torch.Tensor | None:
        """This layer's weighted balancing and z-losses."""
        s, record = self.settings, self.record
        if record is None or not s.adds_loss:
            return None
        total = record.z * s.z_loss_coef
        if s.balance == "loss":
            total = total + record.balance * s.balance_coef
        return total if summed else total / max(record.tokens, 1)

    @torch.no_grad()
    def update_bias(self, stepped: bool = True) -> None:
        """DeepSeek-V3's step: each expert's bias up by bias_rate if it got fewer than the mean of
        the step's tokens, down if more (the counts are the step's, over every data-parallel rank)."""
        if self.settings.balance != "bias":
            return
        counts, self.step_counts = self.step_counts, None
        if stepped and counts is not None:
            self.expert_bias += self.settings.bias_rate * torch.sign(counts.mean() - counts).to(self.expert_bias.dtype)


def _within_capacity(order: torch.Tensor, flat: torch.Tensor, counts: torch.Tensor,
                     capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sorted token-slots each expert keeps (its first `capacity`, in token order) and the
    counts kept."""
    starts = torch.cumsum(counts, 0) - counts
    rank_in_expert = torch.arange(order.numel(), device=order.device) - starts[flat[order]]
    keep = rank_in_expert < capacity
    return order[keep], counts.clamp(max=capacity)
