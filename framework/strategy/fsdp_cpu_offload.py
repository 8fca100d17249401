"""`strategy=fsdp_cpu_offload`: FSDP2 with sharded state kept in CPU memory (a preset of the mesh
strategy, framework/strategy/mesh/, with fsdp's keys)."""
from __future__ import annotations

from framework.strategy.mesh.strategy import MeshStrategy


class FSDPCPUOffloadStrategy(MeshStrategy):
    """FSDP2 whose sharded parameters, gradients and optimizer state live in CPU memory; each unit
    is copied to the device to compute. Trades speed for device memory."""

    name = "fsdp_cpu_offload"

    def __init__(self, *args, cpu_offload: bool = True, **kwargs):
        super().__init__(*args, cpu_offload=cpu_offload, **kwargs)
