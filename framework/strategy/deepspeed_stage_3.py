"""`strategy=deepspeed_stage_3`: ZeRO stage 3: parameters, gradients and optimizer state sharded across ranks."""
from __future__ import annotations

from typing import Literal

from framework.strategy.deepspeed import DeepSpeedStrategy, OffloadDevice


class DeepSpeedStage3Strategy(DeepSpeedStrategy):
    """ZeRO stage 3: parameters, gradients and optimizer state sharded across ranks."""

    name = "deepspeed_stage_3"

    def __init__(self, *args, stage: Literal[0, 1, 2, 3] = 3, offload_optimizer: OffloadDevice = "none",
                 offload_parameters: OffloadDevice = "none", **kwargs):
        super().__init__(*args, stage=stage, offload_optimizer=offload_optimizer,
                         offload_parameters=offload_parameters, **kwargs)
