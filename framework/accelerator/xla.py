"""XLA devices through torch_xla's PJRT runtime: TPUs, or the CPU (`PJRT_DEVICE=CPU`), where the
whole XLA family (framework/strategy/single_xla.py, xla_spmd.py, xla_fsdp.py) runs and is tested.

torch_xla pins its torch version (torch-xla 2.9.0 needs torch 2.9.0 exactly), so it lives in an
environment of its own: `make test-xla` builds `.venv-xla`. torch_xla is imported only in a worker
whose strategy is an XLA one; validation looks for it without importing it.

One process drives all of a host's XLA devices (SPMD): `devices` is the number of devices, not of
processes. On the CPU the devices are virtual (`CPU_NUM_DEVICES`), any number up to 4 per core.
"""
from __future__ import annotations

import glob
import importlib.util
import os

import psutil
import torch

from framework.accelerator.base import Accelerator

CPU_DEVICES_PER_CORE = 4


def tpu_chips() -> int:
    """TPU chips on this host, from their device files (no runtime started)."""
    return len(glob.glob("/dev/accel*")) or len(glob.glob("/dev/vfio/[0-9]*"))


class XLAAccelerator(Accelerator):
    """XLA through PJRT: the TPU where there is one, else the CPU."""

    name = "xla"

    def __init__(self, pjrt_device: str | None = None):
        """pjrt_device: the PJRT runtime (TPU, CPU, ...); null: the PJRT_DEVICE environment
        variable, else TPU where this host has TPU chips, else CPU."""
        self.pjrt_device = pjrt_device

    @property
    def runtime(self) -> str:
        return self.pjrt_device or os.environ.get("PJRT_DEVICE") or ("TPU" if tpu_chips() else "CPU")

    @staticmethod
    def is_available() -> bool:
        return importlib.util.find_spec("torch_xla") is not None

    def unavailable_reason(self) -> str:
        return (f"torch_xla is not installed in this environment (torch {torch.__version__}). torch-xla 2.9.0 needs "
                "torch 2.9.0 exactly, so it has an environment of its own: `make test-xla` builds .venv-xla "
                "(or pip install torch==2.9.0 torch-xla==2.9.0, 'framework[xla]') and run with .venv-xla/bin/python.")

    def max_devices(self) -> int:
        if self.runtime == "CPU":
            return CPU_DEVICES_PER_CORE * (os.cpu_count() or 1)
        return tpu_chips()

    def auto_devices(self) -> int:
        return 1 if self.runtime == "CPU" else self.max_devices()

    def configure_runtime(self, devices: int) -> None:
        """Before torch_xla starts its runtime (in the worker): which PJRT device, and on the CPU how
        many virtual devices."""
        os.environ["PJRT_DEVICE"] = self.runtime
        # XLA's C++ warnings (a GSPMD deprecation notice on every compiled graph) drown the run's
        # own lines; TF_CPP_MIN_LOG_LEVEL=0 in the environment shows them again
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        if self.runtime == "CPU":
            os.environ["CPU_NUM_DEVICES"] = str(devices)

    def device_for(self, local_rank: int) -> torch.device:
        import torch_xla

        return torch_xla.device()

    @property
    def distributed_backend(self) -> str:
        return "xla"

    def supports_bf16(self) -> bool:
        return True

    def fast_fp16(self) -> bool:
        return False

    def memory_bytes(self) -> int | None:
        if self.runtime != "CPU":
            return None  # a TPU's memory is known only once its runtime has started

        return psutil.virtual_memory().total
