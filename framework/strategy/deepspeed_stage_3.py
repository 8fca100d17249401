"""`strategy=deepspeed_stage_3`: ZeRO stage 3: parameters, gradients and optimizer state sharded across ranks."""
from framework.strategy.deepspeed.base import DeepSpeedStrategy


class DeepSpeedStage3Strategy(DeepSpeedStrategy):
    name = "deepspeed_stage_3"
    default_stage = 3
