"""A mixture of experts' routing values under pipeline stages (what framework/models/moe_stats.py
logs beside the loss of an unpipelined step): each rank's stages hold some of the layers, so each
rank reports its own layers' and the loop's mean over every rank makes them the whole model's. The
pipeline (framework/strategy/mesh/pipeline/run.py) asks the task for it (Task.stage_routing).

Per step: each layer's load (its busiest and its idlest expert's tokens over the mean) from the
tokens per expert of all the step's microbatches, counted over the data-parallel ranks, so the
step's load is the whole global batch's, as a single process computing the step in one micro-batch
counts it; the balancing loss, z-loss and dropped fraction as means over the step's microbatches
and over the model's layers."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from framework.models.moe_stats import load_values, routed_modules, router_terms


class StageRouting:
    """The routing records of the stages this rank holds (`stages`: stage index -> module), taken
    after each microbatch's forward."""

    def __init__(self, stages: dict[int, nn.Module]):
        self._modules = {index: routed_modules(module) for index, module in stages.items()}
        self._seen: dict[int, list] = {index: [] for index in stages}
        self._layers: dict[str, int] | None = None  # every value's name over the pipeline: the layers it sums
        for index, module in stages.items():
            if self._modules[index]:
                module.register_forward_hook(self._taker(index))

    def _taker(self, index: int):
        def take(module, args, output):
            # a training forward, not a recompute inside backward (activation checkpointing)
            if torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1:
                modules = [m for m in self._modules[index] if m.record is not None]
                self._seen[index].append((router_terms(modules), [load for m in modules for load in m.loads()]))

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
