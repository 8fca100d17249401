"""`scheduler=cosine`: linear warm-up, then cosine decay."""
from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from framework.config.types import NonNegativeFloat, NonNegativeInt, PositiveInt


def warmup_cosine(optimizer: Optimizer, total_steps: PositiveInt | None, warmup_steps: NonNegativeInt = 0,
                  min_lr_ratio: NonNegativeFloat = 0.0) -> LambdaLR:
    """The LR rises linearly from 0 over `warmup_steps`, then follows a half cosine down to
    `min_lr_ratio` x the base LR at `total_steps`, and stays there. The runner fills a null
    `total_steps` with the run's length (trainer.max_steps, or max_epochs x steps per epoch)."""
    if total_steps is None:
        raise ValueError("total_steps is required (null is filled in by the runner)")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)
