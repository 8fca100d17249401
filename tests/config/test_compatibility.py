"""The compatibility table refuses impossible combinations, naming keys and an alternative."""
from __future__ import annotations

import pytest
import torch

from framework.accelerator.cpu import CPUAccelerator
from framework.accelerator.mps import MPSAccelerator
from framework.checkpoint_io.torch import TorchCheckpointIO
from framework.cluster.local import LocalEnvironment
from framework.config.compatibility import RULES, check_compatibility
from framework.config.plan_facts import Plan
from framework.errors import ConfigError
from framework.precision.bf16_mixed import BF16MixedPrecision
from framework.precision.fp16_mixed import FP16MixedPrecision
from framework.precision.fp32 import FP32Precision
from framework.precision.fp64 import FP64Precision
from framework.strategy.ddp import DDPStrategy
from framework.strategy.single_device import SingleDeviceStrategy


def plan(accelerator=None, precision=None, devices=1, num_nodes=1):
    return Plan(accelerator or CPUAccelerator(), SingleDeviceStrategy(), precision or FP32Precision(),
                TorchCheckpointIO(), LocalEnvironment(), devices, num_nodes)


def test_the_default_is_allowed():
    check_compatibility(plan())


def test_single_device_with_several_processes():
    with pytest.raises(ConfigError, match=r"strategy=single_device runs one process.*devices=2 x num_nodes=1"):
        check_compatibility(plan(devices=2))


def test_more_devices_than_the_machine_has(capsys):
    with pytest.raises(ConfigError, match=r"devices=9: accelerator=cpu has only 2"):
        check_compatibility(plan(CPUAccelerator(max_processes=2), devices=9))  # a cap the user set
    cores = CPUAccelerator().max_devices()
    oversubscribed = Plan(CPUAccelerator(), DDPStrategy(), FP32Precision(), TorchCheckpointIO(), LocalEnvironment(),
                          cores + 2, 1)
    check_compatibility(oversubscribed)  # more processes than cores, and no cap: they share the cores
    assert f"devices={cores + 2} on {cores} cpu core(s): oversubscribed" in capsys.readouterr().err
    oversubscribed.devices = 4 * cores + 1  # beyond 4 per core memory runs out first: refused
    with pytest.raises(ConfigError, match=f"shared by at most {4 * cores} processes; use devices={4 * cores} or fewer"):
        check_compatibility(oversubscribed)


def test_mps_refusals(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    with pytest.raises(ConfigError) as err:
        check_compatibility(plan(MPSAccelerator(), FP64Precision()))
    assert "MPS has no float64" in str(err.value)
    with pytest.raises(ConfigError, match="MPS supports one process only"):
        check_compatibility(plan(MPSAccelerator(), devices=2))


def test_unavailable_accelerator(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"accelerator=mps: .*Use accelerator=cpu"):
        check_compatibility(plan(MPSAccelerator()))


def test_bf16_where_unsupported(monkeypatch):
    monkeypatch.setattr(CPUAccelerator, "supports_bf16", lambda self: False)
    with pytest.raises(ConfigError, match="precision=bf16: accelerator=cpu has no bfloat16"):
        check_compatibility(plan(precision=BF16MixedPrecision()))


def test_slow_fp16_is_a_loud_warning_not_a_refusal(monkeypatch, capsys):
    monkeypatch.setattr(CPUAccelerator, "fast_fp16", lambda self: False)
    check_compatibility(plan(precision=FP16MixedPrecision()))
    assert "WARNING: precision=16 on accelerator=cpu" in capsys.readouterr().err


def test_every_refusal_is_listed_together(monkeypatch):
    monkeypatch.setattr(CPUAccelerator, "supports_bf16", lambda self: False)
    with pytest.raises(ConfigError) as err:
        check_compatibility(plan(precision=BF16MixedPrecision(), devices=2))
    assert "bfloat16" in str(err.value) and "runs one process" in str(err.value)


def test_rules_live_in_one_table():
    assert len(RULES) >= 7 and all(r.level in ("refuse", "warn") for r in RULES)


def test_nvme_offload_refused_without_libaio(monkeypatch):
    """What a machine without libaio sees (this one may have it: tests/strategy/test_nvme_offload.py)."""
    import ctypes.util

    from framework.strategy.deepspeed_stage_3_offload_nvme import DeepSpeedStage3OffloadNvmeStrategy

    real = ctypes.util.find_library
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None if name == "aio" else real(name))
    nvme = Plan(CPUAccelerator(), DeepSpeedStage3OffloadNvmeStrategy(), BF16MixedPrecision(), TorchCheckpointIO(),
                LocalEnvironment(), 2, 1)
    with pytest.raises(ConfigError, match=r"strategy=deepspeed_stage_3_offload_nvme: NVMe offload needs the libaio "
                                          r"library, which is not installed \(Debian/Ubuntu: apt-get install "
                                          r"libaio-dev\); use strategy=deepspeed_stage_3_offload"):
        check_compatibility(nvme)


def test_a_strategy_on_a_torch_too_old_for_it_is_refused_with_the_version(monkeypatch):
    from framework.config import plan_facts
    from framework.config.compatibility import judge
    from framework.config.plan_facts import Plan
    from framework.strategy.fsdp import FSDPStrategy

    monkeypatch.setattr(plan_facts, "torch_version", lambda: (2, 5))
    strategy = FSDPStrategy()
    plan = Plan(strategy.accelerator, strategy, strategy.precision, strategy.checkpoint_io, strategy.cluster, 2, 1)
    refusals, _ = judge(plan)
    assert any("strategy=fsdp needs torch 2.6 or newer (this is torch 2.5)" in r for r in refusals)


@pytest.mark.parametrize("strategy_options", [("pipeline", {}), ("model_parallel", {"pipeline_parallel_size": 2})])
def test_a_task_that_cannot_be_pipelined_is_refused_before_launch(strategy_options):
    """A task without pipeline_split/summed_loss under pipeline stages: refused by the table, naming
    the option the user chose and the task (not found at step 1 in the workers); the built-in tasks
    that train with one loss say how they are split."""
    from framework.config.compatibility import judge
    from framework.config.loop_settings import LoopSettings
    from framework.config.plan_facts import Plan
    from framework.strategy.model_parallel import ModelParallelStrategy
    from framework.strategy.pipeline import PipelineStrategy
    from framework.tasks.classification import Classification
    from framework.tasks.language_modeling import LanguageModeling

    name, settings = strategy_options
    strategy = (PipelineStrategy if name == "pipeline" else ModelParallelStrategy)(**settings)
    plan = Plan(strategy.accelerator, strategy, strategy.precision, strategy.checkpoint_io, strategy.cluster, 2, 1,
                loop=LoopSettings(micro_batch_size=8, task="Regression", stage_split=False))
    refusals, _ = judge(plan)
    assert [r for r in refusals if "pipeline stages" in r] == [
        f"strategy={name} runs the model in pipeline stages, but task Regression does not say how a batch goes "
        "through stages; give it pipeline_split(batch) -> (the first stage's input, the targets) and "
        "summed_loss(outputs, targets) (framework/tasks/base.py), or use strategy=fsdp."]
    plan.loop.stage_split = True
    assert not any("pipeline stages" in r for r in judge(plan)[0])
    assert all(task.pipeline_split is not None and task.summed_loss is not None
               for task in (LanguageModeling, Classification))
