"""`accelerator=tpu`: XLA on this host's TPU chips (framework/accelerator/xla.py), refused where
there are none."""
from __future__ import annotations

from framework.accelerator.xla import XLAAccelerator, tpu_chips


class TPUAccelerator(XLAAccelerator):
    """The XLA accelerator pinned to the TPU runtime."""

    name = "tpu"

    def __init__(self):
        super().__init__(pjrt_device="TPU")

    @staticmethod
    def is_available() -> bool:
        return XLAAccelerator.is_available() and tpu_chips() > 0

    def unavailable_reason(self) -> str:
        if not XLAAccelerator.is_available():
            return super().unavailable_reason()
        return "this host has no TPU chips (no /dev/accel*); accelerator=xla runs the same code on the CPU."
