"""The CPU: always available; `devices` is the number of processes on this node."""
from __future__ import annotations

import os

import torch

from framework.accelerator.base import Accelerator


class CPUAccelerator(Accelerator):
    """Train on the CPU. Several CPU "devices" are several processes sharing the cores."""

    name = "cpu"

    def __init__(self, max_processes: int | None = None):
        """max_processes: the most processes one node may start (default: the number of cores)."""
        self._max = max_processes

    @staticmethod
    def is_available() -> bool:
        return True

    def max_devices(self) -> int:
        return self._max or os.cpu_count() or 1

    @property
    def allows_oversubscription(self) -> bool:
        """More processes than cores share them (each with one thread), unless max_processes caps it."""
        return self._max is None

    def auto_devices(self) -> int:
        return 1

    def device_for(self, local_rank: int) -> torch.device:
        return torch.device("cpu")

    @property
    def distributed_backend(self) -> str:
        return "gloo"

    def supports_bf16(self) -> bool:
        return True

    def memory_bytes(self) -> int | None:
        """The machine's RAM, shared by every process on it."""
        import psutil

        return psutil.virtual_memory().total

    def fast_fp16(self) -> bool:
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
        except (AttributeError, RuntimeError):
            return False
