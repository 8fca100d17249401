"""The DeepSpeed config is built from the plugin groups and the loop (no deepspeed import)."""
from __future__ import annotations

import pytest

from framework.config.loop_settings import LoopSettings
from framework.models.gpt import GPT
from framework.precision.bf16_mixed import BF16MixedPrecision
from framework.precision.fp16_mixed import FP16MixedPrecision
from framework.strategy.deepspeed.config import deep_merge
from framework.strategy.deepspeed.sizes import hidden_size
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


def test_zero_sizes_follow_the_model_and_raw_keys_win():
    """Bucket sizes and ZeRO-3's live-parameter limits come from the model (hidden size h, the
    largest unit U), not DeepSpeed's 5e8/1e9 defaults sized for billion-parameter models."""
    model = GPT(n_layer=2, n_embd=64, n_head=4)
    unit = sum(p.numel() for p in model.blocks[0].parameters())  # a Block: the model's sharding unit
    assert hidden_size(model) == 64
    strategy = DeepSpeedStage3Strategy(config={"zero_optimization": {"reduce_bucket_size": 123}})
    strategy.configure_loop(LoopSettings())
    zero = strategy.deepspeed_config(model)["zero_optimization"]
    assert zero["reduce_bucket_size"] == 123  # the user's key wins
    assert zero["allgather_bucket_size"] == 64 * 64 and zero["stage3_prefetch_bucket_size"] == int(0.9 * 64 * 64)
    assert zero["stage3_param_persistence_threshold"] == 640
    assert zero["stage3_max_live_parameters"] == zero["stage3_max_reuse_distance"] == 2 * unit
    assert zero["sub_group_size"] == unit  # the optimizer step's flattened gradient copy: one unit's worth
    stage2 = DeepSpeedStage2OffloadStrategy()
    stage2.configure_loop(LoopSettings())
    assert not any(k.startswith("stage3_") for k in stage2.deepspeed_config(model)["zero_optimization"])


def test_adam_runs_fused_over_deepspeeds_flat_partitions_unless_the_user_chose():
    import torch

    from framework.strategy.deepspeed.fused_adam import use_fused_adam

    flat = [torch.nn.Parameter(torch.zeros(8))]
    default = torch.optim.AdamW(flat, lr=0.1)
    assert use_fused_adam(default) and default.param_groups[0]["fused"] is True
    chosen = torch.optim.AdamW(flat, lr=0.1, fused=False)
    assert not use_fused_adam(chosen) and chosen.param_groups[0]["fused"] is False
    assert not use_fused_adam(torch.optim.SGD(flat, lr=0.1))
    flat[0].grad = torch.ones(8)
    default.step()  # the fused kernel runs on the CPU
    assert torch.all(flat[0] < 0)


@pytest.mark.slow  # a fresh interpreter or a pool of processes (make test-fast starts none)
def test_deepspeed_is_imported_without_mlflow_and_mlflow_still_imports_after():
    """DeepSpeed's autotuner imports mlflow when installed (1.3 s and 135 MiB per process here);
    framework/strategy/deepspeed/imports.py keeps it out of that import only."""
    import importlib.util
    import os
    import subprocess
    import sys

    script = ("import sys; from framework.strategy.deepspeed.imports import deepspeed_package; "
              "print(deepspeed_package().__name__, 'mlflow' in sys.modules); ")
    if importlib.util.find_spec("mlflow") is not None:  # installed (the dev extras): still importable after
        script += "import mlflow; print(mlflow.__name__)"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.split()
    assert lines[:2] == ["deepspeed", "False"]
    assert lines[2:] in ([], ["mlflow"])


@pytest.mark.slow  # a fresh interpreter or a pool of processes (make test-fast starts none)
def test_deepspeeds_muon_module_is_imported_uncompiled_for_a_torch_optimizer():
    """DeepSpeed's ZeRO optimizers import its Muon module only to check the optimizer's type; its
    import compiles three functions (1 s and 44 MiB per process here). With a torch optimizer it
    is imported with them left as plain Python, and torch.compile's decorator is put back."""
    import os
    import subprocess
    import sys

    script = ("import torch; from framework.strategy.deepspeed.imports import deepspeed_package, muon_left_uncompiled; "
              "deepspeed_package(); muon_left_uncompiled(); "
              "from deepspeed.runtime.zero.muon import original_muon, muon_optimizer; "
              "from deepspeed.runtime import compiler; "
              "print(hasattr(original_muon.muon_update, '_torchdynamo_orig_callable'), compiler.compile() is torch.compile, "
              "muon_optimizer.MuonWithAuxAdam.__name__)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True", "MuonWithAuxAdam"]

