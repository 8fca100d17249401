"""`strategy=deepspeed_stage_2_offload`: ZeRO stage 2 with optimizer state (and the update) offloaded to the CPU."""
from __future__ import annotations

from typing import Literal

from framework.strategy.deepspeed import DeepSpeedStrategy, OffloadDevice


class DeepSpeedStage2OffloadStrategy(DeepSpeedStrategy):
    """ZeRO stage 2 with optimizer state (and the update) offloaded to the CPU."""

    name = "deepspeed_stage_2_offload"

    def __init__(self, *args, stage: Literal[0, 1, 2, 3] = 2, offload_optimizer: OffloadDevice = "cpu",
                 offload_parameters: OffloadDevice = "none", **kwargs):
        super().__init__(*args, stage=stage, offload_optimizer=offload_optimizer,
                         offload_parameters=offload_parameters, **kwargs)
