"""What a mesh layout's appliers are given, instead of the strategy: the option's settings, the
run's mesh, device and ranks, a way to speak, and the model layout they belong to (their siblings'
units, roots and parameters: framework/strategy/mesh/model_layout.py). Each model has its own (a
second, frozen model's appliers are not the trained model's); nothing here loops over appliers."""
from __future__ import annotations

import torch

from framework.construction.units import Units, choose_units


class Placement:
    """An applier's view of the run: read-only settings and the run's places, named one by one."""

    def __init__(self, strategy, layout=None):
        self._strategy = strategy
        #: the ModelLayout of the model these appliers lay out (set when it is made)
        self.layout = layout

    # ---- the option's settings ----------------------------------------------------------------
    @property
    def name(self) -> str:
        """The option's name, as every message says it (fsdp, model_parallel, pipeline...)."""
        return self._strategy.name

    @property
    def dims_settings(self):
        return self._strategy.dims_settings

    @property
    def pipeline(self):
        """The pipeline's settings (framework/strategy/mesh/pipeline/settings.py); None: no stages."""
        return self._strategy.pipeline

    @property
    def tensor(self):
        """The tensor-parallel plan's settings (framework/strategy/mesh/tensor_parallel.py)."""
        return self._strategy.tensor

    @property
    def cpu_offload(self) -> bool:
        return self._strategy.cpu_offload

    @property
    def reshard_after_forward(self) -> bool:
        return self._strategy.reshard_after_forward

    @property
    def precision(self):
        return self._strategy.precision

    @property
    def loop_settings(self):
        """What the loop will do (framework/config/loop_settings.py), told before setup."""
        return self._strategy.loop_settings

    def base_units(self, model: torch.nn.Module) -> Units:
        """The sharding units the settings choose (strategy.wrap_modules, else the model's own, else
        the size rule), before any applier changes them."""
        return choose_units(model, self._strategy.wrap_modules, self._strategy.min_unit_params)

    # ---- the run -------------------------------------------------------------------------------
    @property
    def mesh(self):
        return self._strategy.mesh

    @property
    def root_device(self) -> torch.device:
        return self._strategy.root_device

    @property
    def world_size(self) -> int:
        return self._strategy.world_size

    @property
    def global_rank(self) -> int:
        return self._strategy.global_rank

    def token_group(self):
        """The ranks that read different tokens (None: the whole world; "single": this rank alone)."""
        return self._strategy.token_group()

    def forward_context(self):
        return self._strategy.forward_context()

    def say(self, line: str) -> None:
        """Print `line` once (on global rank zero)."""
        if self._strategy.is_global_zero:
            print(line, flush=True)
