"""`checkpoint_io=xla`: checkpoint_io=torch (atomic, fsynced, weights_only loads) for XLA runs:
the step's pending XLA graph is run first, and any tensor still on an XLA device is fetched to
the CPU before it is written, so the files load anywhere, with or without torch_xla."""
from __future__ import annotations

import sys
from typing import Any

from framework.checkpoint_io.torch import TorchCheckpointIO
from framework.tensors import map_tensors


def to_cpu(data):
    """Every tensor of a nested state on the CPU (XLA tensors are fetched from the device)."""
    return map_tensors(data, lambda t: t.detach().cpu() if t.device.type != "cpu" else t)


class XLACheckpointIO(TorchCheckpointIO):
    """Writes CPU tensors only; reads like checkpoint_io=torch (onto the CPU; the strategy copies
    them into its device tensors)."""

    name = "xla"
    xla = True  # serves XLA runs only (the compatibility table reads it)

    def save(self, obj: Any, path) -> None:
        if "torch_xla" in sys.modules:  # only an XLA run has pending device work to finish
            import torch_xla

            torch_xla.sync()
        super().save(to_cpu(obj), path)
