"""The tensor-parallel applier: a model's (or a pipeline rank's stages') layers split over the
mesh's tensor dimension by the model's plan or strategy.tp_plan (styles and plans:
framework/construction/tensor_parallel.py), and what `framework plan` says of it."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from framework.construction import tensor_parallel
from framework.strategy.abilities import Abilities
from framework.strategy.mesh.applier import Applier


@dataclass(frozen=True)
class TensorParallelSettings:
    """tp_plan: {module name or glob: style}, replacing the model's own plan (None: the model's);
    sequence_parallel: the norms and the activations between split layers also split along the
    sequence (the model's plan must say where)."""

    tp_plan: dict | None = None
    sequence_parallel: bool = False

    def plan(self, model: torch.nn.Module) -> tuple[dict[str, str], str]:
        """(the plan of `model` as {glob: style}, where it came from)."""
        return tensor_parallel.plan_for(model, self.tp_plan, self.sequence_parallel)

    def problems(self, model: torch.nn.Module, size: int, label: str) -> list[str]:
        """Why `model` cannot be split over `size` ranks (label: the size as the user set it)."""
        plan, source = self.plan(model)
        return tensor_parallel.plan_problems(model, plan, source or "strategy.tp_plan", size, self.sequence_parallel,
                                             label)

    def describe(self, model: torch.nn.Module) -> str:
        """`framework plan`: which layers the plan splits and how many parameters stay whole."""
        plan, source = self.plan(model)
        chosen = tensor_parallel.expand(model, plan)
        layers = {name: style for name, style in chosen.items() if style in tensor_parallel.LINEAR_STYLES}
        styles: dict[str, int] = {}
        for style in layers.values():
            styles[style] = styles.get(style, 0) + 1
        split = sum(p.numel() for name in layers for p in model.get_submodule(name).parameters(recurse=False))
        norms = sum(style == "sequence_parallel" for style in chosen.values())
        return (f"tensor parallel: {len(layers)} layers split by {source or 'no plan'} ("
                + ", ".join(f"{n} {style}" for style, n in styles.items())
                + f"); {split:,} parameters split, {sum(p.numel() for p in model.parameters()) - split:,} "
                "whole on each tensor-parallel rank"
                + (f"; sequence parallel: {norms} norms on a share of the positions" if self.sequence_parallel else ""))


def apply_tensor_parallel(model: torch.nn.Module, mesh, plan: tuple[dict[str, str], str],
                          sequence_parallel: bool) -> str:
    """Split `model`'s layers over `mesh` (1-D, the tensor dimension) by `plan` (from plan(): the
    whole model's, whose class names the source); returns what it did, in words."""
    rules, source = plan
    split = tensor_parallel.parallelize(model, mesh, rules, sequence_parallel)
    return (f"{len(split)} modules split by {source}" + (" with sequence parallelism" if sequence_parallel else ""))


class TensorApplier(Applier):
    """Layers split over the mesh's tensor dimension: the plan read from the whole model (before a
    pipeline cuts it), applied first; the norm and the checkpoint state then taken by hand."""

    norm_by_hand = True
    state_by_hand = True
    abilities = Abilities(splits_layers=True, collective_forward=True)

    def __init__(self, placement, dims):
        super().__init__(placement, dims)
        self.settings: TensorParallelSettings = placement.tensor
        self.plan: tuple[dict[str, str], str] | None = None

    @classmethod
    def wanted(cls, placement, dims) -> bool:
        if dims is None:  # unresolvable sizes (problems() reports them): as the key says
            return placement.dims_settings.tensor not in (1, "auto")
        return dims.tensor > 1

    def problems(self, model):
        if model is None or self.dims.expert > 1:  # the experts' applier judges those layouts (ORDER's next)
            return []
        label = f"auto ({self.dims.tensor})" if self.placement.dims_settings.tensor == "auto" else str(self.dims.tensor)
        return self.settings.problems(model, self.dims.tensor, label)

    def lines(self, model):
        if self.dims.expert > 1 or self.placement.pipeline is not None:
            return []  # the experts' or the pipeline's lines say the mesh
        lines = [f"mesh: {self.dims.describe()}: each batch computed by {self.dims.tensor} rank(s) together, the states "
                 "of the split layers divided over every rank, the rest over the data-parallel ranks (the estimate "
                 "below divides all of them by every rank)"]
        return lines + ([self.settings.describe(model)] if model is not None else [])

    def build(self, model):
        self.plan = self.settings.plan(model)  # the whole model's (its class names the source)
        return model

    def apply(self, model):
        done = apply_tensor_parallel(model, self.placement.mesh["tensor"], self.plan or self.settings.plan(model),
                                     self.settings.sequence_parallel)
        self.placement.say(f"{self.placement.name}: {self.dims.describe()}; {done}")
