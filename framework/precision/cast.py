"""Whole-model precision shared by `64`, `16_true` and `bf16_true`: everything in one dtype."""
from __future__ import annotations

from contextlib import contextmanager

import torch

from framework.precision.base import Precision, cast_floating


class CastPrecision(Precision):
    """Casts the module and every floating-point input to `dtype`; tensors created during the
    forward pass default to it too. The optimizer then updates `dtype` weights directly."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.param_dtype = self.compute_dtype = dtype

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.to(dtype=self.param_dtype)

    def convert_input(self, batch):
        return cast_floating(batch, self.param_dtype)

    @contextmanager
    def forward_context(self):
        previous = torch.get_default_dtype()
        torch.set_default_dtype(self.param_dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(previous)
