"""`precision=16_true`: the whole model in fp16 (half the memory; no float32 master weights)."""
import torch

from framework.precision.cast import CastPrecision


class FP16TruePrecision(CastPrecision):
    """Weights, inputs and compute in float16."""

    name = "16_true"

    def __init__(self):
        super().__init__(torch.float16)
