"""`strategy=deepspeed_stage_1`: ZeRO stage 1: optimizer state sharded across ranks."""
from __future__ import annotations

from typing import Literal

from framework.strategy.deepspeed import DeepSpeedStrategy, OffloadDevice


class DeepSpeedStage1Strategy(DeepSpeedStrategy):
    """ZeRO stage 1: optimizer state sharded across ranks."""

    name = "deepspeed_stage_1"

    def __init__(self, *args, stage: Literal[0, 1, 2, 3] = 1, offload_optimizer: OffloadDevice = "none",
                 offload_parameters: OffloadDevice = "none", **kwargs):
        super().__init__(*args, stage=stage, offload_optimizer=offload_optimizer,
                         offload_parameters=offload_parameters, **kwargs)
