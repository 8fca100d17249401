"""`accelerator=auto`: the best device type this machine has (cuda, then mps, then cpu)."""
from __future__ import annotations

from framework.accelerator.base import Accelerator
from framework.accelerator.cpu import CPUAccelerator
from framework.accelerator.cuda import CUDAAccelerator
from framework.accelerator.mps import MPSAccelerator

PREFERENCE = (CUDAAccelerator, MPSAccelerator, CPUAccelerator)


def auto_accelerator() -> Accelerator:
    """Return an instance of the first available device type in PREFERENCE."""
    for cls in PREFERENCE:
        if cls.is_available():
            return cls()
    return CPUAccelerator()
