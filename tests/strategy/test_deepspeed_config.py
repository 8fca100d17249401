"""The DeepSpeed config is built from the plugin groups and the loop (no deepspeed import)."""
from __future__ import annotations

from framework.precision.bf16_mixed import BF16MixedPrecision
from framework.precision.fp16_mixed import FP16MixedPrecision
from framework.config.loop_settings import LoopSettings
from framework.strategy.deepspeed import deep_merge
from framework.strategy.deepspeed_stage_2_offload import DeepSpeedStage2OffloadStrategy
from framework.strategy.deepspeed_stage_3 import DeepSpeedStage3Strategy
from framework.strategy.deepspeed_stage_3_offload_nvme import DeepSpeedStage3OffloadNvmeStrategy


def config_of(strategy, **loop):
    strategy.configure_loop(LoopSettings(**{"micro_batch_size": 8, "accumulate": 4, "clip_grad_norm": 0.5, **loop}))
    return strategy.deepspeed_config()


def test_loop_and_precision_become_deepspeed_keys():
    c = config_of(DeepSpeedStage3Strategy(precision=BF16MixedPrecision()))
    assert c["train_micro_batch_size_per_gpu"] == 8 and c["gradient_accumulation_steps"] == 4
    assert c["gradient_clipping"] == 0.5 and c["bf16"] == {"enabled": True} and "fp16" not in c
    assert c["zero_optimization"] == {"stage": 3}
    assert c["managed_gradient_accumulation"] is False and c["zero_force_ds_cpu_optimizer"] is False
    fp16 = config_of(DeepSpeedStage3Strategy(precision=FP16MixedPrecision()), clip_grad_norm=None)
    assert fp16["fp16"]["enabled"] and fp16["gradient_clipping"] == 0.0
    assert "bf16" not in config_of(DeepSpeedStage3Strategy())


def test_offload_sections():
    c = config_of(DeepSpeedStage2OffloadStrategy())
    assert c["zero_optimization"] == {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": False}}
    nvme = config_of(DeepSpeedStage3OffloadNvmeStrategy(nvme_path="/fast"))["zero_optimization"]
    assert nvme["offload_param"] == {"device": "nvme", "pin_memory": False, "nvme_path": "/fast"}
    assert nvme["offload_optimizer"]["nvme_path"] == "/fast"


def test_raw_keys_override_and_extend():
    s = DeepSpeedStage3Strategy(config={"zero_optimization": {"overlap_comm": True}, "gradient_clipping": 2.0})
    c = config_of(s)
    assert c["zero_optimization"] == {"stage": 3, "overlap_comm": True} and c["gradient_clipping"] == 2.0
    assert deep_merge({"a": {"b": 1, "c": 2}}, {"a": {"b": 3}, "d": 4}) == {"a": {"b": 3, "c": 2}, "d": 4}
