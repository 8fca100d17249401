"""One model's layout: its appliers (in the strategy's ORDER, as its dims call for them) and how
each hook combines over them (applier.py's COMBINED, stated once and enforced: `checked`). The
trained model has one; a second, frozen model (a preference task's reference, a distillation's
teacher) is built and placed through one of its own, so neither's appliers hold the other's state.
The strategy loops over nothing itself: it asks the layout."""
from __future__ import annotations

import math
from contextlib import ExitStack, contextmanager, nullcontext

import torch

from framework.construction.units import Units
from framework.strategy.abilities import Abilities
from framework.strategy.base import Layout
from framework.strategy.mesh.applier import checked
from framework.strategy.mesh.fully_shard import materialise
from framework.strategy.mesh.placement import Placement
from framework.strategy.mesh.schedule import Schedule


class ModelLayout:
    """The appliers of one model and the combined hooks the strategy calls."""

    def __init__(self, strategy, dims, order):
        """`dims`: the resolved sizes (None where they do not resolve: the appliers the settings
        alone call for, to say what is wrong); `order`: the applier kinds, in the order they build."""
        self.placement = Placement(strategy, self)
        self.dims = dims
        wanted = [kind(self.placement, dims) for kind in order if kind.wanted(self.placement, dims)]
        self.appliers = checked(wanted) if dims is not None else wanted
        #: the initialisation recorded by a build on the meta device, replayed into this rank's tensors
        self.init_log = None

    # ---- before launch -------------------------------------------------------------------------
    @property
    def abilities(self) -> Abilities:
        return Abilities().combined([a.abilities for a in self.appliers])

    @property
    def mesh_dims(self) -> tuple[str, ...]:
        return tuple(d for a in self.appliers for d in a.mesh_dims)

    def problems(self, model: torch.nn.Module | None) -> list[str]:
        return next((found for a in self.appliers if (found := a.problems(model))), [])

    def layout(self, world_size: int, model: torch.nn.Module | None) -> Layout:
        lines = tuple(line for a in self.appliers for line in a.lines(model))
        layout = Layout(world_size, self.dims.unnamed(lines) if self.dims is not None else lines)
        for applier in self.appliers:
            layout = applier.layout(layout, model)
        return layout

    def units(self, model: torch.nn.Module) -> Units:
        """The settings' sharding units as the appliers leave them (experts spread: not gathered)."""
        units = self.placement.base_units(model)
        for applier in self.appliers:
            units = applier.units(units, model)
        return units

    # ---- building --------------------------------------------------------------------------------
    def build(self, model: torch.nn.Module) -> torch.nn.Module:
        for applier in self.appliers:
            model = applier.build(model)
        return model

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        """The appliers in order, then this rank's tensors materialised on `device` (where the model
        was built on the meta device), then their last steps."""
        for applier in self.appliers:
            applier.apply(model)
        schedule = self.schedule
        if self.init_log is not None:
            log, self.init_log = self.init_log, None
            (schedule.materialise if schedule is not None else materialise)(model, log, device)
        if schedule is not None:
            schedule.attach(model)
        return model

    @property
    def schedule(self) -> Schedule | None:
        """The schedule that runs this layout's steps itself (a pipeline's, once built); None: plain steps."""
        return next((found for a in self.appliers if (found := a.schedule()) is not None), None)

    def roots(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """The modules FSDP2 shards as roots: the model, or the schedule's (a rank's stages)."""
        return self.schedule.roots(model) if self.schedule is not None else [model]

    def ignored_parameters(self) -> set:
        return set().union(*(a.ignored_parameters() for a in self.appliers))

    # ---- a step ------------------------------------------------------------------------------------
    def split_batch(self, batch):
        for applier in self.appliers:
            batch = applier.split_batch(batch)
        return batch

    @property
    def loss_weight(self) -> int:
        return math.prod(a.loss_weight for a in self.appliers)

    def forward_backward(self, model, task, batch, group, scale, loss_of):
        """The schedule's passes (a pipeline's), else None: the strategy's plain step."""
        schedule = self.schedule
        return None if schedule is None else schedule.forward_backward(model, task, batch, group, scale, loss_of)

    @contextmanager
    def no_sync(self, model, skip: bool):
        with ExitStack() as stack:
            for context in (a.no_sync(model, skip) for a in self.appliers):
                stack.enter_context(context or nullcontext())
            yield

    def clip_inputs(self, model) -> tuple[bool, list | None, object]:
        """Before the norm: each applier's last gradient work; then (the norm taken by hand, the
        parameters it counts where not all, a group its squares are summed over besides the meshes')."""
        for applier in self.appliers:
            applier.before_clip(model)
        schedule = self.schedule
        counted, across = (schedule.counted(model), schedule.norm_group) if schedule is not None else (None, None)
        return any(a.norm_by_hand for a in self.appliers), counted, across

    def before_step(self) -> None:
        for applier in self.appliers:
            applier.before_step()

    def after_zero_grad(self) -> None:
        for applier in self.appliers:
            applier.after_zero_grad()

    # ---- checkpoints ---------------------------------------------------------------------------------
    @property
    def state_by_hand(self) -> bool:
        """State gathered tensor by tensor (split layers, stages), not by DCP."""
        return any(a.state_by_hand for a in self.appliers)

    def merged(self, own: dict, merge: str) -> dict | None:
        """`own` merged by the schedule (`merge`: merged_model_state or merged_optimizer_state);
        None where there is none."""
        return None if self.schedule is None else getattr(self.schedule, merge)(own)

    def load_model_state(self, model, full: dict) -> bool:
        """Loaded by the schedule (True), or left to the strategy's plain way (False)."""
        if self.schedule is None:
            return False
        self.schedule.load_model_state(model, full)
        return True

    def optimizer_state_to_load(self, model, full: dict) -> dict:
        return full if self.schedule is None else self.schedule.optimizer_state_to_load(model, full)
