"""Apple-silicon GPUs through Metal (MPS): one device, one process."""
from __future__ import annotations

import torch

from framework.accelerator.base import Accelerator


class MPSAccelerator(Accelerator):
    """Train on an Apple GPU. One process only; no float64."""

    name = "mps"

    @staticmethod
    def is_available() -> bool:
        backend = getattr(torch.backends, "mps", None)
        return bool(backend and backend.is_available())

    def unavailable_reason(self) -> str:
        return "MPS needs an Apple-silicon Mac with a torch build that supports it."

    def max_devices(self) -> int:
        return 1

    def device_for(self, local_rank: int) -> torch.device:
        return torch.device("mps")

    @property
    def distributed_backend(self) -> str:
        return "gloo"
