"""`precision=16`: fp16 autocast with dynamic loss scaling (Lightning's 16-mixed)."""
import torch

from framework.config.types import PositiveFloat, PositiveInt
from framework.precision.autocast import AutocastPrecision


class FP16MixedPrecision(AutocastPrecision):
    """float32 weights, fp16 compute, a GradScaler against underflow."""

    name = "16"

    def __init__(self, init_scale: PositiveFloat = 65536.0, growth_interval: PositiveInt = 2000):
        """init_scale: the first loss scale; growth_interval: clean steps before the scale doubles."""
        super().__init__(torch.float16, loss_scaling=True, init_scale=init_scale,
                         growth_interval=growth_interval)
