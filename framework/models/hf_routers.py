"""A Hugging Face mixture of experts' routers, watched so that its own balancing loss is counted as
the built-in GPT's is (framework/models/moe.py): its tokens per expert over the data-parallel ranks'
micro-batch, its probabilities summed over this rank's tokens and divided as the language-model
loss is, so the loss does not depend on the layout.

transformers' families (Qwen3-MoE, Mixtral, OLMoE, gpt-oss, DeepSeek-V3, ...) route in a
`<Family>TopKRouter` module whose first output is the router's logits and last the chosen experts,
and add `router_aux_loss_coef` x transformers' `load_balancing_loss_func` (Switch's loss pooled
over the layers: num_experts x sum_e f_e x P_e, f_e the share of token-slots that chose e, summing
to top_k) only when the model is given labels, which the framework's task never gives it. Here a
forward hook keeps each router's outputs of a training forward, and the loss is that formula with
the counts all-reduced.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from framework.construction.routing import Routed, RouterRecord


def routers(model: nn.Module) -> list[nn.Module]:
    """The model's top-k router modules (transformers' naming: a class ending in TopKRouter)."""
    return [m for m in model.modules() if type(m).__name__.lower().endswith("topkrouter")]


class RouterBalance(Routed):
    """Holds nothing to train or save: it watches `routers` and computes the balancing loss."""

    def __init__(self, watched: list[nn.Module], num_experts: int, top_k: int, coef: float):
        super().__init__()
        self.num_experts, self.top_k, self.coef = num_experts, top_k, coef
        self.outputs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.record: RouterRecord | None = None
        self.per_layer: list[torch.Tensor] = []
        self._count = len(watched)
        for router in watched:
            router.register_forward_hook(self._keep)

    def _keep(self, module, inputs, output) -> None:
        if not module.training or not torch.is_grad_enabled() or torch._C._current_graph_task_id() != -1:
            return  # evaluation, generation, or an activation checkpoint's recompute
        if len(self.outputs) == self._count:  # a new forward
            self.outputs = []
        self.outputs.append((output[0], output[-1]))
        if len(self.outputs) == self._count:
            self._settle()

    def _settle(self) -> None:
        """Once a forward, when every router has routed: the counts over the token group."""
        e = self.num_experts
        rows = self.outputs[0][0].shape[0]
        per_layer = torch.stack([torch.bincount(chosen.reshape(-1), minlength=e).double() for _, chosen in self.outputs])
        totals = torch.cat([per_layer.flatten(), per_layer.new_tensor([float(rows)])])
        group = self.token_group if self.token_group != "default" else (
            dist.group.WORLD if dist.is_available() and dist.is_initialized() else None)
        if group is not None:
            dist.all_reduce(totals, group=group)
        self.per_layer = list(totals[:-1].view(len(self.outputs), e))
        layers, rows_all = len(self.outputs), totals[-1]
        fraction = (sum(self.per_layer) / (rows_all * layers)).float()  # transformers' tokens_per_expert
        probabilities = sum(logits.float().softmax(dim=-1).sum(dim=0) for logits, _ in self.outputs)
        balance = e * (fraction * probabilities).sum() / layers  # summed over this rank's rows
        self.record = RouterRecord(balance, balance.new_zeros(()), rows, sum(self.per_layer), balance.new_zeros(()))

    def loads(self) -> list[tuple[int, torch.Tensor]]:
        return list(enumerate(self.per_layer)) if self.record is not None else []

    def losses(self, summed: bool) -> torch.Tensor | None:
        if self.record is None or self.coef <= 0:
            return None
        loss = self.coef * self.record.balance
        return loss if summed else loss / max(self.record.tokens, 1)


def watch_routers(model: nn.Module) -> nn.Module:
    """`model` with a RouterBalance (as its `router_balance` submodule) where its config routes tokens
    to experts (num_experts_per_tok) and it has top-k routers; else unchanged."""
    config = getattr(model, "config", None)
    top_k = getattr(config, "num_experts_per_tok", None)
    found = routers(model)
    if not top_k or not found:
        return model
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    coef = float(getattr(config, "router_aux_loss_coef", 0.0) or 0.0)
    for module in model.modules():  # stacked experts: FLOPs and `plan` count a token's share of them
        if type(module).__name__.endswith("Experts") and getattr(module, "num_experts", None):
            module.active_fraction = int(top_k) / int(module.num_experts)
    model.add_module("router_balance", RouterBalance(found, int(experts), int(top_k), coef))
    return model
