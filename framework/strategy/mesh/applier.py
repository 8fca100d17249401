"""What every part of a mesh layout looks like: an applier.

A layout is the resolved parallel dims (dims.py) plus the appliers that the dims call for, run in
one fixed order (strategy.py's ORDER). Each applier is a small object in a file of its own with the
surface below, all optional; the mesh strategy loops over them and never asks which dimension is
there. Adding a dimension: one applier file, one entry in ORDER, one field of the settings.

Before launch: `problems` (its refusals, each naming the key and the fix), `lines` (what
`framework plan` prints), `layout` (what it changes of the memory estimate's layout).
Building, in the order of ORDER: `build` (the model on the meta device: a pipeline cuts it), then
in the workers `apply` (tensor parallelism splits layers, FSDP shards...), `materialise` (the one
applier that knows how this rank's tensors are allocated, else the plain way), `finish`.
A step: `batch` (a rank's share of the batch), `loss_weight`, `forward_backward` (a schedule that
runs the passes itself), `no_sync`, `before_clip`, and the clip's `norm_by_hand`,
`counted`, `norm_group`; `before_step`, `after_zero_grad`.
Checkpoints: `state_by_hand`, `merge_model_state`, `merge_optimizer_state`, `load_model_state`,
`optimizer_state_to_load`.
What the layout can do (`abilities`, framework/strategy/abilities.py; the compatibility table reads
the strategy's): every one of its appliers' abilities combined.

How the strategy combines a hook over a layout's appliers is declared once, in COMBINED below, and
the rule "one" is enforced when a layout's appliers are chosen (`checked`): two appliers
of one layout that both implement such a hook (two schedules, two ways to merge a checkpoint) are a
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
    "build": "fold", "apply": "each", "roots": "one", "ignored_parameters": "union", "materialise": "one",
    "finish": "each",
    "split_batch": "fold", "loss_weight": "product", "forward_backward": "one", "no_sync": "each", "before_clip": "each",
    "counted": "one", "norm_group": "one", "before_step": "each", "after_zero_grad": "each",
    "merge_model_state": "one", "merge_optimizer_state": "one", "load_model_state": "one",
    "optimizer_state_to_load": "fold",
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
    """One part of a mesh layout; `strategy` is the mesh strategy it belongs to (its settings, dims,
    mesh, precision and device), `dims` the resolved dims it was chosen for."""

    #: the gradient norm is taken by hand (parameters on several meshes, or stages)
    norm_by_hand = False
    #: checkpoint state gathered tensor by tensor (split layers, stages), not by DCP's full state
    state_by_hand = False
    #: dims kept on the device mesh at size 1 too
    mesh_dims: tuple[str, ...] = ()
    #: what a layout with this applier can do (the strategy's: every applier's, combined)
    abilities = Abilities()

    def __init__(self, strategy, dims):
        self.strategy, self.dims = strategy, dims

    @classmethod
    def wanted(cls, strategy, dims) -> bool:
        """Whether a layout of `dims` under `strategy`'s settings has this applier."""
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

    def roots(self, model: torch.nn.Module) -> list[torch.nn.Module] | None:
        """The modules FSDP shards as roots, where not the model (a pipeline rank's stages)."""
        return None

    def ignored_parameters(self) -> set:
        """Parameters FSDP must leave alone (placed by this applier)."""
        return set()

    def materialise(self, model: torch.nn.Module, log, device: torch.device) -> bool:
        """Allocate this rank's tensors and replay the initialisation; False: not this applier's."""
        return False

    def finish(self, model: torch.nn.Module) -> None:
        pass

    # ---- a step --------------------------------------------------------------------------------
    def split_batch(self, batch):
        """This rank's share of a moved batch (cut through framework/batch_split.py); the batch itself."""
        return batch

    loss_weight = 1

    def forward_backward(self, model, task, batch, group, scale, loss_of):
        """A micro-batch's forward and backward where this applier runs them itself (a pipeline's
        schedule): (the loss the guard watches, the logged share); None: the strategy's own."""
        return None

    def no_sync(self, model: torch.nn.Module, skip: bool) -> AbstractContextManager | None:
        return None

    def before_clip(self, model: torch.nn.Module) -> None:
        pass

    def counted(self, model: torch.nn.Module) -> list | None:
        """The parameters the gradient norm counts, where not all (a tied head's copy left out)."""
        return None

    norm_group = None  # a process group the norm's squares are summed over besides the meshes'

    def before_step(self) -> None:
        pass

    def after_zero_grad(self) -> None:
        pass

    # ---- checkpoints ---------------------------------------------------------------------------
    def merge_model_state(self, own: dict) -> dict | None:
        return None

    def merge_optimizer_state(self, own: dict) -> dict | None:
        return None

    def load_model_state(self, model: torch.nn.Module, full: dict) -> bool:
        return False

    def optimizer_state_to_load(self, model: torch.nn.Module, full: dict) -> dict:
        return full


