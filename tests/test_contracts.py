"""The built-in plugins pass the same contract suites a user's plugin runs (framework.testing)."""
from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import framework.testing as contract

ACCELERATORS = ["cpu.CPUAccelerator", "cuda.CUDAAccelerator", "mps.MPSAccelerator"]
PRECISIONS = ["fp32.FP32Precision", "fp64.FP64Precision", "bf16_mixed.BF16MixedPrecision", "bnb_int8.BnbInt8Precision",
              "bnb_nf4.BnbNF4Precision", "bnb_nf4_dq.BnbNF4DoubleQuantPrecision", "bnb_fp4.BnbFP4Precision",
              "fp16_mixed.FP16MixedPrecision", "bf16_true.BF16TruePrecision", "fp16_true.FP16TruePrecision"]
CHECKPOINT_IOS = ["torch.TorchCheckpointIO", "async.AsyncCheckpointIO", "dcp.DCPCheckpointIO"]
STRATEGIES = ["single_device.SingleDeviceStrategy", "ddp.DDPStrategy", "ddp_spawn.DDPSpawnStrategy",
              "fsdp.FSDPStrategy", "fsdp_cpu_offload.FSDPCPUOffloadStrategy", "ddp_sharded.DDPShardedStrategy"]
# DeepSpeed keeps process-group state per process: checked in a fresh interpreter (one for all five).
DEEPSPEED = ["deepspeed_stage_1.DeepSpeedStage1Strategy", "deepspeed_stage_2.DeepSpeedStage2Strategy",
             "deepspeed_stage_2_offload.DeepSpeedStage2OffloadStrategy", "deepspeed_stage_3.DeepSpeedStage3Strategy",
             "deepspeed_stage_3_offload.DeepSpeedStage3OffloadStrategy"]
MAIN = {"MASTER_ADDR": "node1", "MASTER_PORT": "29500"}
CLUSTERS = [
    ("torchelastic.TorchElasticEnvironment", {**MAIN, "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                                              "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}, 2, 2),
    ("slurm.SLURMEnvironment", {"SLURM_NTASKS": "4", "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
                                "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_ID": "77",
                                "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "gpu[007-008]", "SLURM_JOB_NAME": "train"}, 2, 2),
    ("kubeflow.KubeflowEnvironment", {**MAIN, "RANK": "1", "WORLD_SIZE": "3", "KUBERNETES_PORT": "tcp://k"}, 1, 3),
]


def load(package: str, dotted: str):
    module, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(f"framework.{package}.{module}"), name)


@pytest.mark.parametrize("dotted", ACCELERATORS)
def test_accelerator_contract(dotted):
    contract.check_accelerator(load("accelerator", dotted))


@pytest.mark.parametrize("dotted", PRECISIONS)
def test_precision_contract(dotted):
    contract.check_precision(load("precision", dotted))


@pytest.mark.parametrize("dotted", CHECKPOINT_IOS)
def test_checkpoint_io_contract(dotted, tmp_path):
    contract.check_checkpoint_io(load("checkpoint_io", dotted), tmp_path)


@pytest.mark.parametrize("dotted,variables,devices,num_nodes", CLUSTERS, ids=[c[0] for c in CLUSTERS])
def test_cluster_contract(dotted, variables, devices, num_nodes):
    contract.check_cluster_environment(load("cluster", dotted), variables, devices, num_nodes)


@pytest.mark.parametrize("dotted", STRATEGIES)
def test_strategy_contract(dotted):
    contract.check_strategy(load("strategy", dotted))


_DEEPSPEED_CHECK = """
import importlib, json, traceback
import framework.testing as contract
for dotted in json.loads(input()):
    module, name = f"framework.strategy.{dotted}".rsplit(".", 1)
    try:
        contract.check_strategy(getattr(importlib.import_module(module), name))
        print(json.dumps([dotted, "CONTRACT OK"]), flush=True)
    except BaseException:
        print(json.dumps([dotted, traceback.format_exc()]), flush=True)
"""


@pytest.fixture(scope="module")
def deepspeed_contracts() -> dict[str, str]:
    """Each DeepSpeed strategy's contract checked in one fresh interpreter (deepspeed imported once,
    not into the test process): {dotted: 'CONTRACT OK' or the failure}."""
    import json

    result = subprocess.run([sys.executable, "-c", _DEEPSPEED_CHECK], input=json.dumps(DEEPSPEED), capture_output=True,
                            text=True, timeout=600)
    outcomes = dict(json.loads(line) for line in result.stdout.splitlines() if line.startswith("["))
    return {dotted: outcomes.get(dotted, result.stdout[-2000:] + result.stderr[-3000:]) for dotted in DEEPSPEED}


@pytest.mark.slow
@pytest.mark.parametrize("dotted", DEEPSPEED)
def test_deepspeed_strategy_contract(dotted, deepspeed_contracts):
    assert deepspeed_contracts[dotted] == "CONTRACT OK", deepspeed_contracts[dotted]


def test_a_broken_plugin_fails_the_contract(tmp_path):
    from framework.checkpoint_io.torch import TorchCheckpointIO

    class ForgetfulIO(TorchCheckpointIO):
        name = "forgetful"

        def load(self, path):
            state = super().load(path)
            return {**state, "step": 0} if isinstance(state, dict) and "step" in state else state

    with pytest.raises(AssertionError, match="plain values round-trip"):
        contract.check_checkpoint_io(ForgetfulIO, tmp_path)
