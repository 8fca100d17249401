"""The Accelerator base class: what device a rank computes on."""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class Accelerator(ABC):
    """A device type. Constructors are side-effect free; nothing touches a device until
    `setup_device` is called in a worker process.

    Method surface, in the order the runner uses it:
    `is_available` / `unavailable_reason` / `max_devices` (validation, before any process starts),
    `resolve_devices` (the `devices` key to a count), `device_for(local_rank)` and
    `setup_device` (in each worker), `distributed_backend`, `supports_bf16` / `fast_fp16`.
    """

    name: str = "base"
    #: the environment variable that limits which of this type's devices a process sees (a replica
    #: group's own GPUs: framework/launch/replica_groups.py); None where devices cannot be handed out
    visible_devices_env: str | None = None

    @staticmethod
    @abstractmethod
    def is_available() -> bool:
        """Whether this device type exists on this machine."""

    def unavailable_reason(self) -> str:
        return f"no {self.name} device is available on this machine."

    @abstractmethod
    def max_devices(self) -> int:
        """How many devices of this type one node can use (processes, for the CPU)."""

    def max_processes(self) -> int:
        """The most processes a node may start: more than `max_devices()` share the devices
        (slower, but every rank runs), as the CPU's cores can; a GPU cannot be split."""
        return self.max_devices()

    def auto_devices(self) -> int:
        """What `devices=auto` means for this device type."""
        return self.max_devices()

    def resolve_devices(self, devices) -> int:
        return self.auto_devices() if devices == "auto" else int(devices)

    @abstractmethod
    def device_for(self, local_rank: int) -> torch.device:
        """The device the process with this local rank computes on."""

    def setup_host_memory(self, low_memory: bool) -> None:
        """Called once per process before the model is built; `low_memory`: the strategy shards the
        model's states, or the precision quantizes it, to save memory. The CPU, whose device memory is host memory, returns
        freed buffers to the OS there (framework/accelerator/cpu.py); others need nothing."""

    def setup_device(self, device: torch.device) -> None:
        """Make `device` current for this process (e.g. torch.cuda.set_device)."""

    @property
    @abstractmethod
    def distributed_backend(self) -> str:
        """The torch.distributed backend for this device type (gloo, nccl)."""

    def supports_bf16(self) -> bool:
        return True

    def memory_bytes(self) -> int | None:
        """Memory of one device (`framework plan` compares the estimate with it); None if unknown."""
        return None

    def fast_fp16(self) -> bool:
        """Whether fp16 math runs in hardware (if not, precision=16 is warned about)."""
        return True

    def fast_bf16(self) -> bool:
        """Whether bf16 math runs in hardware (if not, precision=bf16 is warned about)."""
        return True

    def fp8_support(self) -> str | None:
        """None when this device runs fp8 matmuls (precision=te_fp8), else why not."""
        return f"accelerator={self.name} has no fp8 matmuls"

    @property
    def autocast_device_type(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
