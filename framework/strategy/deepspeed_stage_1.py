"""`strategy=deepspeed_stage_1`: ZeRO stage 1: optimizer state sharded across ranks."""
from framework.strategy.deepspeed.base import DeepSpeedStrategy


class DeepSpeedStage1Strategy(DeepSpeedStrategy):
    name = "deepspeed_stage_1"
    default_stage = 1
