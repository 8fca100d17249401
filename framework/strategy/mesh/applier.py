"""What every part of a mesh layout looks like: an applier.

A layout is the resolved parallel dims (dims.py) plus the appliers that the dims call for, run in
one fixed order (strategy.py's ORDER), one layout per model (model_layout.py: the trained model's,
a frozen second model's). Each applier is a small object in a file of its own with the surface
below, all optional, given a Placement (placement.py), not the strategy; the model's layout combines
the hooks and never asks which dimension is there. Adding a dimension: one Dimension (dims.py's
DIMENSIONS); where it changes the model or the step, one applier file and one entry in ORDER.

Before launch: `problems` (its refusals, each naming the key and the fix), `lines` (what
`framework plan` prints), `layout` (what it changes of the memory estimate's layout), `units`.
Building, in the order of ORDER: `build` (the model on the meta device: a pipeline cuts it), then
in the workers `apply` (tensor parallelism splits layers, FSDP shards...), `ignored_parameters`.
A step: `split_batch` (a rank's share of the batch), `loss_weight`, `no_sync`, `before_clip`, the
clip's `norm_by_hand`; `before_step`, `after_zero_grad`. Checkpoints: `state_by_hand`.
The other side of the surface, `schedule` (framework/strategy/mesh/schedule.py): a layout whose
step runs in a schedule of its own (pipeline stages) answers through it for the roots FSDP2
shards, how this rank's tensors are allocated, each micro-batch's passes, the norm's parameters
and group, and the checkpoint state's merging and loading; no other applier carries those.
What the layout can do (`abilities`, framework/strategy/abilities.py; the compatibility table reads
the strategy's): every one of its appliers' abilities combined.

How a model's layout combines a hook over its appliers is declared once, in COMBINED below, and
the rule "one" is enforced when a layout's appliers are chosen (`checked`): two appliers
of one layout that both implement such a hook (two schedules) are a
ConfigError naming both, never a silent first-wins decided by ORDER.
"""
from __future__ import annotations

from contextlib import AbstractContextManager

import torch

from framework.errors import ConfigError
from framework.strategy.abilities import Abilities
from framework.strategy.layout import Layout

#: each hook, and how the mesh strategy combines it over the layout's appliers, in ORDER:
#: each (every applier's, in order), fold (each transforms what the one before returned), first (the
#: first applier that has any: its answer), any (true if one says so), union / concat (all answers
#: together), product (multiplied), one (at most one applier of a layout implements it: enforced)
COMBINED = {
    "norm_by_hand": "any", "state_by_hand": "any", "mesh_dims": "union", "abilities": "union",
    "problems": "first", "lines": "concat", "layout": "fold", "units": "fold",
    "build": "fold", "apply": "each", "ignored_parameters": "union",
    "split_batch": "fold", "loss_weight": "product", "no_sync": "each", "before_clip": "each",
    "before_step": "each", "after_zero_grad": "each", "schedule": "one",
}


def implementers(appliers, hook: str) -> list:
    """The appliers that implement `hook` themselves (not the base class's default)."""
    return [a for a in appliers if getattr(type(a), hook) is not getattr(Applier, hook)]


def checked(appliers: list) -> list:
    """`appliers`, refused where two implement a hook that only one may (COMBINED's "one")."""
    for hook, rule in COMBINED.items():
        claiming = implementers(appliers, hook)
        if rule == "one" and len(claiming) > 1:
            names = " and ".join(type(a).__name__ for a in claiming)
            raise ConfigError(f"a mesh layout's appliers {names} both implement `{hook}`, which one applier alone may "
                              "(framework/strategy/mesh/applier.py, COMBINED): these dimensions do not combine; set "
                              "one of them to 1.")
    return appliers


class Applier:
    """One part of a model's mesh layout; `placement` is what it is given (framework/strategy/mesh/placement.py:
    the option's settings, the mesh, the device, a way to speak, and its model's layout for what its
    siblings decide), `dims` the resolved dims it was chosen for."""

    #: the gradient norm is taken by hand (parameters on several meshes, or stages)
    norm_by_hand = False
    #: checkpoint state gathered tensor by tensor (split layers, stages), not by DCP's full state
    state_by_hand = False
    #: dims kept on the device mesh at size 1 too
    mesh_dims: tuple[str, ...] = ()
    #: what a layout with this applier can do (the strategy's: every applier's, combined)
    abilities = Abilities()

    def __init__(self, placement, dims):
        self.placement, self.dims = placement, dims

    @classmethod
    def wanted(cls, placement, dims) -> bool:
        """Whether a layout of `dims` under the placement's settings has this applier."""
        return True

    # ---- before launch -----------------------------------------------------------------------
    def problems(self, model: torch.nn.Module | None) -> list[str]:
        return []

    def lines(self, model: torch.nn.Module | None) -> list[str]:
        return []

    def layout(self, layout: Layout, model: torch.nn.Module | None) -> Layout:
        return layout

    def units(self, units, model: torch.nn.Module):
        """The sharding units as this applier leaves them (experts: not gathered)."""
        return units

    # ---- building ------------------------------------------------------------------------------
    def build(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def apply(self, model: torch.nn.Module) -> None:
        pass

    def ignored_parameters(self) -> set:
        """Parameters FSDP must leave alone (placed by this applier)."""
        return set()

    # ---- a step --------------------------------------------------------------------------------
    def split_batch(self, batch):
        """This rank's share of a moved batch (cut through framework/batch_split.py); the batch itself."""
        return batch

    loss_weight = 1

    def no_sync(self, model: torch.nn.Module, skip: bool) -> AbstractContextManager | None:
        return None

    def before_clip(self, model: torch.nn.Module) -> None:
        pass

    def before_step(self) -> None:
        pass

    def after_zero_grad(self) -> None:
        pass

    # ---- the other side: a step run in a schedule of its own (framework/strategy/mesh/schedule.py) ----
    def schedule(self):
        """The layout's schedule where this applier runs each step itself (a pipeline's, once its
        stages are built); None: the strategy's plain step."""
        return None
