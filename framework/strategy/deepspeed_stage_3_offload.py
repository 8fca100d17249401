"""`strategy=deepspeed_stage_3_offload`: ZeRO stage 3 with parameters and optimizer state offloaded to the CPU."""
from framework.strategy.deepspeed.base import DeepSpeedStrategy


class DeepSpeedStage3OffloadStrategy(DeepSpeedStrategy):
    name = "deepspeed_stage_3_offload"
    default_stage = 3
    default_offload_optimizer = "cpu"
    default_offload_parameters = "cpu"
