"""`checkpoint_io=xla`: checkpoint_io=torch (atomic, fsynced, weights_only loads) for XLA runs:
the step's pending XLA graph is run first, and any tensor still on an XLA device is fetched to
the CPU before it is written, so the files load anywhere, with or without torch_xla."""
from __future__ import annotations

import sys
from typing import Any

import torch

from framework.checkpoint_io.torch import TorchCheckpointIO


def to_cpu(data):
    """Every tensor of a nested state on the CPU (XLA tensors are fetched from the device)."""
    if isinstance(data, torch.Tensor):
        return data.detach().cpu() if data.device.type != "cpu" else data
    if isinstance(data, dict):
        return {k: to_cpu(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(to_cpu(v) for v in data)
    return data


class XLACheckpointIO(TorchCheckpointIO):
    """Writes CPU tensors only; reads like checkpoint_io=torch (onto the CPU; the strategy copies
    them into its device tensors)."""

    name = "xla"

    def save(self, obj: Any, path) -> None:
        if "torch_xla" in sys.modules:  # only an XLA run has pending device work to finish
            import torch_xla

            torch_xla.sync()
        super().save(to_cpu(obj), path)
