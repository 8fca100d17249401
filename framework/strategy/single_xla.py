"""`strategy=single_xla`: one process on one XLA device (accelerator=xla or tpu).

XLA records operations lazily and compiles each step's graph; `torch_xla.sync()` after every
optimizer step cuts the graph there (the same graph every step, compiled once). Checkpoints hold
plain CPU tensors keyed by parameter name, so they move to and from every other strategy.
"""
from __future__ import annotations

import torch

from framework.checkpoint_io.xla import to_cpu
from framework.construction.named_state import load_optimizer_state_by_name, optimizer_state_by_name, strict_load
from framework.strategy.abilities import Abilities
from framework.strategy.base import Strategy


class SingleXLAStrategy(Strategy):
    """One XLA device. The base of the SPMD strategies (framework/strategy/xla_spmd.py)."""

    name = "single_xla"
    multi_process = False
    #: an XLA strategy: the compatibility table pairs it with the XLA accelerators only
    xla = True
    replica_groups_refusal = ("XLA compiles the step, its collectives inside the graph: torchft's average between "
                              "the groups cannot sit in it")
    #: XLA compiles the whole step itself; checkpoints are gathered whole on the CPU (DCP writes them
    #: as one process)
    abilities = Abilities(compile=False, sharded_state=False)
    setup_note = "XLA compiles the step's graph the first time it runs"

    def setup_environment(self) -> None:
        self.accelerator.configure_runtime(self.devices)
        self._before_runtime()
        super().setup_environment()

    def _before_runtime(self) -> None:
        """What must happen before the first XLA tensor exists (SPMD mode)."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        import torch_xla

        stepped = self.precision.optimizer_step(optimizer)
        torch_xla.sync()  # one graph per step: forward, backward and update
        return stepped

    # Portable state: CPU tensors by parameter name, as single_device writes them.
    def model_state_dict(self, model) -> dict:
        return to_cpu(self.unwrap(model).state_dict())

    def load_model_state_dict(self, model, state: dict) -> None:
        module = self.unwrap(model)  # copied into the device tensors, keeping their sharding
        module.load_state_dict(state, strict=strict_load(module, state))

    def optimizer_state_dict(self, model, optimizer) -> dict:
        return to_cpu(optimizer_state_by_name(self.unwrap(model), optimizer))

    def load_optimizer_state_dict(self, model, optimizer, state: dict) -> None:
        load_optimizer_state_by_name(self.unwrap(model), optimizer, state)  # torch moves it to each parameter's device
