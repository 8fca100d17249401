"""An accelerator of a machine other than this one, for `framework plan --device cuda
--device-memory 80GiB` on a login node: the device type's own settings (its name, backend and
device placement), with what only the target machine could say given or assumed instead: it
exists, as many devices as asked for, the memory given, and a current GPU's number formats
(bf16, fp16 and fp8 tensor cores)."""
from __future__ import annotations

import torch

from framework.accelerator.base import Accelerator


class PlannedAccelerator(Accelerator):
    """Stands in for `real` (a CUDAAccelerator, say) on a machine that does not have it."""

    def __init__(self, real: Accelerator, memory: int | None):
        self.real = real
        self.name = real.name
        self.memory = memory

    def is_available(self) -> bool:  # the target machine has it
        return True

    def max_devices(self) -> int:
        return 1 << 16  # as many as the plan asks for: the target machine's count is not known here

    def auto_devices(self) -> int:
        return 1

    def device_for(self, local_rank: int) -> torch.device:
        return self.real.device_for(local_rank)

    @property
    def distributed_backend(self) -> str:
        return self.real.distributed_backend

    def memory_bytes(self) -> int | None:
        return self.memory

    # bf16 and fp16 in hardware: the base class's answers (not the real type's, which asks a device)
    def fp8_support(self) -> str | None:
        return None

    def __getattr__(self, name: str):  # anything else is the device type's own
        return getattr(self.__dict__["real"], name)


def planned(accelerator: Accelerator, memory: int | None) -> PlannedAccelerator:
    """`accelerator` as the target machine will have it (`framework plan --device`)."""
    return accelerator if isinstance(accelerator, PlannedAccelerator) else PlannedAccelerator(accelerator, memory)
