"""`strategy=deepspeed_stage_3_offload_nvme`: ZeRO stage 3 with parameters and optimizer state offloaded to NVMe (needs libaio)."""
from framework.strategy.deepspeed.base import DeepSpeedStrategy


class DeepSpeedStage3OffloadNvmeStrategy(DeepSpeedStrategy):
    name = "deepspeed_stage_3_offload_nvme"
    default_stage = 3
    default_offload_optimizer = "nvme"
    default_offload_parameters = "nvme"
