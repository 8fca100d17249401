"""`strategy=deepspeed_stage_2`: ZeRO stage 2: optimizer state and gradients sharded across ranks."""
from framework.strategy.deepspeed.base import DeepSpeedStrategy


class DeepSpeedStage2Strategy(DeepSpeedStrategy):
    name = "deepspeed_stage_2"
    default_stage = 2
