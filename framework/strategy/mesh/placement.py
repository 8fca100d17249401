"""What a mesh layout's appliers are given, instead of the strategy: the option's settings, the
run's mesh, device and ranks, a way to speak, and the model layout they belong to (their siblings'
units, roots and parameters: framework/strategy/mesh/model_layout.py). Each model has its own (a
second, frozen model's appliers are not the trained model's); nothing here loops over appliers."""
from __future__ import annotations

import torch

from framework.construction.units import Units, choose_units


def _read(name: str, doc: str) -> property:
    """A read-only view of the strategy's `name`."""
    return property(lambda self: getattr(self._strategy, name), doc=doc)


class Placement:
    """An applier's view of the run: read-only settings and the run's places, named one by one."""

    def __init__(self, strategy, layout=None):
        self._strategy = strategy
        #: the ModelLayout of the model these appliers lay out (set when it is made)
        self.layout = layout

    # ---- the option's settings ----------------------------------------------------------------
    name = _read("name", "The option's name, as every message says it (fsdp, model_parallel, pipeline...).")
    dims_settings = _read("dims_settings", "The sizes as the option's keys give them (mesh/dims.py).")
    pipeline = _read("pipeline", "The pipeline's settings (mesh/pipeline/settings.py); None: no stages.")
    tensor = _read("tensor", "The tensor-parallel plan's settings (mesh/tensor_parallel.py).")
    cpu_offload = _read("cpu_offload", "Sharded states kept in CPU memory.")
    reshard_after_forward = _read("reshard_after_forward", "Gathered parameters freed after forward.")
    precision = _read("precision", "The precision plugin.")
    loop_settings = _read("loop_settings", "What the loop will do (config/loop_settings.py), told before setup.")

    def base_units(self, model: torch.nn.Module) -> Units:
        """The sharding units the settings choose (strategy.wrap_modules, else the model's own, else
        the size rule), before any applier changes them."""
        return choose_units(model, self._strategy.wrap_modules, self._strategy.min_unit_params)

    # ---- the run -------------------------------------------------------------------------------
    mesh = _read("mesh", "The device mesh (made on first use in a worker).")
    root_device = _read("root_device", "This rank's device.")
    world_size = _read("world_size", "The run's ranks.")
    global_rank = _read("global_rank", "This rank.")

    def token_group(self):
        """The ranks that read different tokens (None: the whole world; "single": this rank alone)."""
        return self._strategy.token_group()

    def forward_context(self):
        return self._strategy.forward_context()

    def say(self, line: str) -> None:
        """Print `line` once (on global rank zero)."""
        if self._strategy.is_global_zero:
            print(line, flush=True)
