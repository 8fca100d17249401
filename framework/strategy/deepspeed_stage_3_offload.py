"""`strategy=deepspeed_stage_3_offload`: ZeRO stage 3 with parameters and optimizer state offloaded to the CPU."""
from __future__ import annotations

from typing import Literal

from framework.strategy.deepspeed import DeepSpeedStrategy, OffloadDevice


class DeepSpeedStage3OffloadStrategy(DeepSpeedStrategy):
    """ZeRO stage 3 with parameters and optimizer state offloaded to the CPU."""

    name = "deepspeed_stage_3_offload"

    def __init__(self, *args, stage: Literal[0, 1, 2, 3] = 3, offload_optimizer: OffloadDevice = "cpu",
                 offload_parameters: OffloadDevice = "cpu", **kwargs):
        super().__init__(*args, stage=stage, offload_optimizer=offload_optimizer,
                         offload_parameters=offload_parameters, **kwargs)
