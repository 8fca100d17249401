"""`strategy=deepspeed_stage_2`: ZeRO stage 2: optimizer state and gradients sharded across ranks."""
from __future__ import annotations

from typing import Literal

from framework.strategy.deepspeed import DeepSpeedStrategy, OffloadDevice


class DeepSpeedStage2Strategy(DeepSpeedStrategy):
    """ZeRO stage 2: optimizer state and gradients sharded across ranks."""

    name = "deepspeed_stage_2"

    def __init__(self, *args, stage: Literal[0, 1, 2, 3] = 2, offload_optimizer: OffloadDevice = "none",
                 offload_parameters: OffloadDevice = "none", **kwargs):
        super().__init__(*args, stage=stage, offload_optimizer=offload_optimizer,
                         offload_parameters=offload_parameters, **kwargs)
