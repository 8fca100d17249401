"""A mixture of experts' routing under pipeline stages: its values (what framework/models/moe_stats.py
logs beside the loss of an unpipelined step) and its losses. Each rank's stages hold some of the
layers, so each rank reports its own layers' and the loop's mean over every rank makes them the
whole model's. The pipeline (framework/strategy/mesh/pipeline/run.py) asks the task for it
(Task.stage_routing).

The losses (balancing, z-loss): only the last stage computes the pipeline's loss, so each stage's
layers add theirs to the stage's own backward instead, as Megatron's MoEAuxLossAutoScaler does:
the stage's output passes through an identity whose backward also gives the stage's routing loss
the gradient `weight` (the pipeline's scale for the microbatch's loss), exactly what adding it to
the loss would give. Each pipeline microbatch counts its tokens per expert over the data-parallel
ranks' same microbatch, so the balancing loss is that of one process whose micro-batches are the
pipeline's microbatches (the z-loss, a sum over tokens, that of one process at any micro-batch).

Per step: each layer's load (its busiest and its idlest expert's tokens over the mean) from the
tokens per expert of all the step's microbatches, counted over the data-parallel ranks, so the
step's load is the whole global batch's, as a single process computing the step in one micro-batch
counts it; the balancing loss, z-loss and dropped fraction as means over the step's microbatches
and over the model's layers."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from framework.models.moe_stats import load_values, routed_modules, router_losses, router_terms


class LossGradient(torch.autograd.Function):
    """`output` unchanged; in backward, `loss` (a scalar the output does not depend on) also gets
    the gradient `weight`, as if `weight * loss` had been added to what is backpropagated."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, loss: torch.Tensor, weight: float) -> torch.Tensor:
        ctx.weight, ctx.like = weight, (loss.dtype, loss.device)
        # the same storage, not a view of `output` (torch's zero-bubble schedules detach a stage's
        # output in place, which a custom function's view refuses)
        return output.detach()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        dtype, device = ctx.like
        return grad, torch.tensor(ctx.weight, dtype=dtype, device=device), None


class StageRouting:
    """The routing records of the stages this rank holds (`stages`: stage index -> module), taken
    after each microbatch's forward, and their losses joined to each stage's backward."""

    def __init__(self, stages: dict[int, nn.Module]):
        self._modules = {index: routed_modules(module) for index, module in stages.items()}
        self._seen: dict[int, list] = {index: [] for index in stages}
        self._layers: dict[str, int] | None = None  # every value's name over the pipeline: the layers it sums
        self._weight: float | None = None  # a microbatch's routing loss's gradient (None: no loss joined)
        self._summed = True  # whether that weight multiplies the losses summed over the tokens, or their mean
        for index, module in stages.items():
            if self._modules[index]:
                module.register_forward_hook(self._taker(index))

    def weigh_losses(self, weight: float, summed: bool) -> None:
        """The next microbatches' routing losses enter their stage's backward times `weight`: the
        pipeline's scale of its microbatch loss (`summed`: the losses summed over the microbatch's
        tokens, as a normalised task's summed loss; else their mean, weight 1 / (microbatches x
        micro-batches a step) as a mean loss is)."""
        self._weight, self._summed = weight, summed

    def _taker(self, index: int):
        def take(module, args, output):
            # a training forward, not a recompute inside backward (activation checkpointing)
            if not torch.is_grad_enabled() or torch._C._current_graph_task_id() != -1:
                return None
            modules = [m for m in self._modules[index] if m.record is not None]
            self._seen[index].append((router_terms(modules), [load for m in modules for load in m.loads()]))
            loss = router_losses(module, self._summed) if self._weight is not None else None
            if loss is None:
                return None
            if isinstance(output, torch.Tensor):
                return LossGradient.apply(output, loss, self._weight)
            # a stage returning several tensors (torch's pipelining passes tuples on): the first carries it
            return (LossGradient.apply(output[0], loss, self._weight), *output[1:])

        return take

    def values(self, microbatches: int, group, pipeline: int, device: torch.device) -> dict[str, torch.Tensor]:
        """This step's values, the same names on every rank of the pipeline: its own layers' times
        the pipeline size (the convention the pipeline's loss follows), the other stages' zero, so
        that the loop's mean over every rank is the model's."""
        sums: dict[str, torch.Tensor] = {}
        layers: dict[str, int] = {}
        for index, seen in self._seen.items():
            # the step's microbatches: a new schedule's first call of a stage is torch's shape
            # inference, whose records are not the step's
            step, self._seen[index] = seen[len(seen) - microbatches:], []
            if not step:
                continue
            for name, (_, count) in step[0][0].items():
                means = torch.stack([torch.as_tensor(terms[name][0], dtype=torch.float64) for terms, _ in step]).mean()
                sums[name] = sums.get(name, 0) + means
                layers[name] = layers.get(name, 0) + count
            for position, (layer, _) in enumerate(step[0][1]):
                counts = torch.stack([loads[position][1].to(torch.float64) for _, loads in step]).sum(0)
                for name, value in load_values(layer, counts).items():
                    sums[name], layers[name] = value, 1
        if self._layers is None:  # said once: which values the pipeline's stages report, over how many layers
            gathered: list = [None] * dist.get_world_size(group)
            dist.all_gather_object(gathered, layers, group=group)
            self._layers = {}
            for each in gathered:
                for name, count in each.items():
                    self._layers[name] = self._layers.get(name, 0) + count
        zero = torch.zeros((), device=device)
        return {name: (sums[name].float().to(device) * pipeline / total if name in sums else zero)
                for name, total in self._layers.items()}
