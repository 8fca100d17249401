"""`precision=bf16_true`: the whole model in bf16 (half the memory; no float32 master weights)."""
import torch

from framework.precision.cast import CastPrecision


class BF16TruePrecision(CastPrecision):
    """Weights, inputs and compute in bfloat16."""

    name = "bf16_true"

    def __init__(self):
        super().__init__(torch.bfloat16)
