"""`precision=64`: float64 weights, inputs and compute (numerical checks, scientific models)."""
import torch

from framework.precision.cast import CastPrecision


class FP64Precision(CastPrecision):
    """The model and float inputs in float64."""

    name = "64"

    def __init__(self):
        super().__init__(torch.float64)
