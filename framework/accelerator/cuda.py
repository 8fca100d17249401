"""NVIDIA GPUs through CUDA: one process per GPU."""
from __future__ import annotations

import torch

from framework.accelerator.base import Accelerator


class CUDAAccelerator(Accelerator):
    """Train on CUDA GPUs; local rank i uses GPU i."""

    name = "cuda"
    visible_devices_env = "CUDA_VISIBLE_DEVICES"

    @staticmethod
    def is_available() -> bool:
        return torch.cuda.is_available()

    def unavailable_reason(self) -> str:
        if torch.version.cuda is None:
            return "this torch build has no CUDA support (a CPU-only build is installed)."
        return "torch cannot see a CUDA GPU on this machine (check the driver and CUDA_VISIBLE_DEVICES)."

    def memory_bytes(self) -> int | None:
        return torch.cuda.get_device_properties(0).total_memory if self.is_available() else None

    def max_devices(self) -> int:
        return torch.cuda.device_count()

    def device_for(self, local_rank: int) -> torch.device:
        return torch.device("cuda", local_rank)

    def setup_device(self, device: torch.device) -> None:
        torch.cuda.set_device(device)

    @property
    def distributed_backend(self) -> str:
        return "nccl"

    def supports_bf16(self) -> bool:
        return self.is_available() and torch.cuda.is_bf16_supported()

    def fp8_support(self) -> str | None:
        """fp8 tensor cores: compute capability 8.9 (Ada) and later (Hopper 9.0, Blackwell 10.0)."""
        if not self.is_available():
            return "torch sees no CUDA GPU"
        major, minor = torch.cuda.get_device_capability(0)
        if (major, minor) < (8, 9):
            return (f"{torch.cuda.get_device_name(0)} has compute capability {major}.{minor}; fp8 needs 8.9 or later "
                    "(L4, L40, RTX 40xx, H100, H200, B200)")
        return None
