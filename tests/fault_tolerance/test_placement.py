"""Where replica groups run on a GPU machine, and what carries their average: each group one block
of the GPUs (CUDA_VISIBLE_DEVICES), shared and warned about where there are too few, NCCL between
groups only where each has GPUs of its own. No GPU is needed: the accelerator is a stand-in that
says it has some, and the groups are stand-in processes."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from framework.accelerator.cpu import CPUAccelerator
from framework.accelerator.cuda import CUDAAccelerator
from framework.checkpoint_io.torch import TorchCheckpointIO
from framework.cluster.local import LocalEnvironment
from framework.config.compatibility import check_compatibility
from framework.config.plan_facts import Plan
from framework.errors import ConfigError
from framework.fault_tolerance import torchft as torchft_plugin
from framework.fault_tolerance.torchft import TorchFT
from framework.launch import replica_groups
from framework.launch.replica_groups import group_devices, placement, supervise
from framework.precision.fp32 import FP32Precision
from framework.strategy.ddp import DDPStrategy

pytest.importorskip("torchft")


class FakeGPUs(CUDAAccelerator):
    """A CUDA accelerator that says it sees `count` GPUs."""

    def __init__(self, count: int):
        self.count = count

    def is_available(self) -> bool:
        return True

    def max_devices(self) -> int:
        return self.count


def test_groups_take_consecutive_blocks_and_wrap_around_where_there_are_too_few():
    assert group_devices(["0", "1", "2", "3"], groups=2, per_group=2) == [["0", "1"], ["2", "3"]]
    assert group_devices(["0", "1", "2", "3", "4", "5", "6", "7"], 4, 2)[3] == ["6", "7"]
    # 3 groups of 2 on 4 GPUs: the third shares the first's, its own two still distinct
    assert group_devices(["0", "1", "2", "3"], groups=3, per_group=2) == [["0", "1"], ["2", "3"], ["0", "1"]]
    assert group_devices(["0"], groups=2, per_group=1) == [["0"], ["0"]]


def test_placement_hands_out_the_gpus_this_command_sees(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert placement(FakeGPUs(4), per_group=2, groups=2) == [{"CUDA_VISIBLE_DEVICES": "0,1"},
                                                             {"CUDA_VISIBLE_DEVICES": "2,3"}]
    # a scheduler's own list (ids or UUIDs) is what is split, in its order
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,GPU-a1b2,7,3")
    assert placement(FakeGPUs(4), per_group=1, groups=4) == [{"CUDA_VISIBLE_DEVICES": d}
                                                             for d in ("5", "GPU-a1b2", "7", "3")]
    assert placement(CPUAccelerator(), per_group=2, groups=2) == [{}, {}]  # the cores are split otherwise


def test_devices_auto_is_each_groups_equal_block_of_the_gpus():
    assert TorchFT(replica_groups=2).resolve_devices(FakeGPUs(8), "auto") == 4
    assert TorchFT(replica_groups=3).resolve_devices(FakeGPUs(8), "auto") == 2  # two left idle, not shared
    assert TorchFT(replica_groups=2).resolve_devices(FakeGPUs(1), "auto") == 1
    assert TorchFT(replica_groups=2).resolve_devices(FakeGPUs(8), 3) == 3
    # a group itself (replica_id given) sees only its own GPUs: auto is all of those
    assert TorchFT(replica_groups=2, replica_id=1, lighthouse="h:1").resolve_devices(FakeGPUs(4), "auto") == 4
    assert TorchFT(replica_groups=2).resolve_devices(CPUAccelerator(), "auto") == 1  # the CPU's auto: one process


def test_each_group_is_started_with_its_own_gpus(monkeypatch, tmp_path):
    started = []

    class Exited:
        def __init__(self, command, env, **_):
            started.append((command, env))
            self.stdout = io.StringIO("")

        def poll(self):
            return 0

    monkeypatch.setattr(replica_groups.subprocess, "Popen", Exited)
    said = []
    ft = TorchFT(replica_groups=2, port="auto")
    devices = [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]
    summary = supervise(ft, ["train.py", "devices=2"], Path(tmp_path), said.append, devices)
    assert [env["CUDA_VISIBLE_DEVICES"] for _, env in started] == ["0,1", "2,3"]
    assert [command[-1] for command, _ in started] == [f"hydra.run.dir={tmp_path / 'replica_0'}",
                                                       f"hydra.run.dir={tmp_path / 'replica_1'}"]
    assert "fault_tolerance: group 1 on CUDA_VISIBLE_DEVICES=2,3" in said
    assert [g["exits"] for g in summary["replica_groups"]] == [[0], [0]]


def _plan(accelerator, devices=1, **settings) -> Plan:
    return Plan(accelerator, DDPStrategy(), FP32Precision(), TorchCheckpointIO(), LocalEnvironment(), devices, 1,
                fault_tolerance=TorchFT(**settings))


def test_groups_that_would_share_gpus_are_warned_about_and_nccl_between_them_refused(capsys):
    check_compatibility(_plan(FakeGPUs(4), devices=2, replica_groups=2, process_group="nccl"))  # a block each
    assert "share GPUs" not in capsys.readouterr().err
    check_compatibility(_plan(FakeGPUs(1), replica_groups=2))
    assert ("fault_tolerance.replica_groups=2 x devices=1 on 1 GPU(s): the groups share GPUs (each takes the next 1 "
            "in turn, starting over at the first)") in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"fault_tolerance.process_group=nccl with 3 replica groups x devices=2 on 4 "
                                          r"GPU\(s\): the groups would share GPUs.*use fault_tolerance.process_group=gloo"):
        check_compatibility(_plan(FakeGPUs(4), devices=2, replica_groups=3, process_group="nccl"))
    # groups started as jobs of their own (replica_id given) get their GPUs from the scheduler
    check_compatibility(_plan(FakeGPUs(1), replica_groups=2, replica_id=1, lighthouse="host:1", process_group="nccl"))


def test_nccl_between_groups_on_the_cpu_is_refused_naming_the_fix():
    with pytest.raises(ConfigError, match="fault_tolerance.process_group=nccl with accelerator=cpu: NCCL joins GPUs; "
                                          "use fault_tolerance.process_group=gloo"):
        check_compatibility(_plan(CPUAccelerator(), process_group="nccl"))


@pytest.mark.parametrize("kind", ["gloo", "nccl"])
def test_the_quorum_group_is_torchfts_of_that_kind_and_notes_a_duplicate_id(monkeypatch, kind):
    from torchft import process_group

    class Recorded:
        def __init__(self, timeout):
            self.timeout = timeout

        def configure(self, *args):
            self.configured = args

    name = "ProcessGroupNCCL" if kind == "nccl" else "ProcessGroupGloo"
    monkeypatch.setattr(process_group, name, Recorded)
    monkeypatch.setenv("TORCH_NCCL_NONBLOCKING_TIMEOUT", "unset")  # restored (removed) after the test
    monkeypatch.delenv("TORCH_NCCL_NONBLOCKING_TIMEOUT")
    plugin = TorchFT(process_group=kind, step_timeout_s=45)
    group = torchft_plugin._quorum_group(plugin, torchft_plugin.timedelta(seconds=45))
    assert isinstance(group, Recorded) and group.timeout.total_seconds() == 45
    group.configure("addr", "group1", 0, 2, 3, 0, 1, [0, 1])
    assert not plugin._duplicate_id and group.configured[1] == "group1"
    group.configure("addr", "group1", 0, 2, 4, 0, 1, [1, 1])  # two groups in the same places
    assert plugin._duplicate_id
    if kind == "nccl":  # torchft's own default (30 minutes) would outlast a step's limit
        assert torchft_plugin.os.environ["TORCH_NCCL_NONBLOCKING_TIMEOUT"] == "45.0"
