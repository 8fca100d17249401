"""`strategy=xla_spmd`: one process drives `devices` XLA devices with SPMD (torch_xla's GSPMD):
each batch is split along its first dimension over a one-axis device mesh, the weights are
replicated, and the XLA compiler inserts the gradient all-reduce. Data parallel, like ddp, but
with one process per host (what torch_xla supports on the CPU: its multi-process launcher runs
one thread per device in a single process there).

`data.batch_size` is the batch of the one process: it is split over the devices, so it must be
divisible by `devices` (refused before launch otherwise). `strategy=xla_fsdp` shards the weights
and optimizer state too (framework/strategy/xla_fsdp.py).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from framework.strategy.abilities import Abilities
from framework.strategy.single_xla import SingleXLAStrategy
from framework.tensors import map_tensors


class XLASPMDStrategy(SingleXLAStrategy):
    """SPMD data parallel over all of this host's XLA devices, in one process."""

    name = "xla_spmd"
    #: one process drives all of a node's devices: `devices` does not start processes
    spmd = True
    #: the mesh axis a batch (and, for xla_fsdp, each weight's first dimension) is split along
    axis = "data"
    # one program over every device: a host's forward runs with the other hosts'
    abilities = Abilities(compile=False, sharded_state=False, collective_forward=True)

    def _before_runtime(self) -> None:
        import torch_xla.runtime as xr

        xr.use_spmd()  # before any XLA tensor exists

    def setup_environment(self) -> None:
        super().setup_environment()
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        count = xr.global_runtime_device_count()
        self.mesh = xs.Mesh(np.arange(count), (count,), (self.axis,))

    def problems(self, model) -> list[str]:
        batch = self.loop_settings.micro_batch_size
        if batch and batch % self.devices:
            return [f"data.batch_size={batch} with strategy={self.name} devices={self.devices}: each batch is split "
                    f"over the devices, so it must be divisible by {self.devices}; use data.batch_size="
                    f"{max(self.devices, batch - batch % self.devices)}."]
        return []

    def _split(self, tensor: torch.Tensor) -> torch.Tensor:
        import torch_xla.distributed.spmd as xs

        if tensor.dim() and tensor.shape[0] % self.mesh.size() == 0:
            xs.mark_sharding(tensor, self.mesh, (self.axis,) + (None,) * (tensor.dim() - 1))
        return tensor

    def batch_to_device(self, batch: Any) -> Any:
        return map_tensors(super().batch_to_device(batch), self._split)


