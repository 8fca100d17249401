"""`strategy=deepspeed_stage_2_offload`: ZeRO stage 2 with optimizer state (and the update) offloaded to the CPU."""
from framework.strategy.deepspeed.base import DeepSpeedStrategy


class DeepSpeedStage2OffloadStrategy(DeepSpeedStrategy):
    name = "deepspeed_stage_2_offload"
    default_stage = 2
    default_offload_optimizer = "cpu"
