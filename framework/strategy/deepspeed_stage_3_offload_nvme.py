"""`strategy=deepspeed_stage_3_offload_nvme`: ZeRO stage 3 with parameters and optimizer state offloaded to NVMe (needs libaio)."""
from __future__ import annotations

from typing import Literal

from framework.strategy.deepspeed import DeepSpeedStrategy, OffloadDevice


class DeepSpeedStage3OffloadNvmeStrategy(DeepSpeedStrategy):
    """ZeRO stage 3 with parameters and optimizer state offloaded to NVMe (needs libaio)."""

    name = "deepspeed_stage_3_offload_nvme"

    def __init__(self, *args, stage: Literal[0, 1, 2, 3] = 3, offload_optimizer: OffloadDevice = "nvme",
                 offload_parameters: OffloadDevice = "nvme", **kwargs):
        super().__init__(*args, stage=stage, offload_optimizer=offload_optimizer,
                         offload_parameters=offload_parameters, **kwargs)
