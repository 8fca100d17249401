"""`precision=bf16`: bf16 autocast, float32 weights (Lightning's bf16-mixed). No loss scaling:
bf16 has float32's exponent range."""
import torch

from framework.precision.autocast import AutocastPrecision


class BF16MixedPrecision(AutocastPrecision):
    """float32 weights, bf16 compute."""

    name = "bf16"

    def __init__(self):
        super().__init__(torch.bfloat16, loss_scaling=False)
