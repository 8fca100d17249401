"""benchmarks/gpu_check.py (`make gpu-check`) checked on the CPU, so the script is ready the day a
GPU is lent: a row that trains, a refused one with its reason, a resume compared bit for bit,
replica groups (their heal row's verdict on summaries of its own: tests/fault_tolerance heals groups
for real), and the refusal to run without CUDA."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def test_the_gpu_check_runs_its_rows_on_the_cpu(tmp_path):
    table = tmp_path / "table.md"
    # the rows of a machine of one device (`--devices 1`): each row one process, the replica groups
    # two of one (the script's self-check; multi-process runs are checked by tests/strategy and
    # tests/fault_tolerance)
    result = subprocess.run([sys.executable, str(SCRIPT), "--accelerator", "cpu", "--devices", "1", "--rows",
                             "single_device/32/torch,single_device/te_fp8/torch,ddp/32/dcp,ddp/32/torch/torchft", "--out",
                             str(table)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {tuple(c.strip() for c in line.split("|")[1:6]): [c.strip() for c in line.split("|")[6:-1]]
            for line in table.read_text().splitlines()[4:]}
    outcome, last, diff, _, why = rows[("single_device", "32", "torch", "1", "")]
    # the CPU against itself: two runs of one job, within float32 rounding (bit-equal on an idle
    # machine; 4.8e-07 apart once on an AMX CPU under load, see docs/checkpoints.md, "Reproducibility")
    assert outcome == "ok" and float(diff) < 1e-5
    outcome, last, diff, _, why = rows[("single_device", "32", "torch", "1", "trainer.compile=true")]
    assert outcome == "ok" and float(diff) < 1e-5  # compiled against the eager CPU reference (the same key)
    assert rows[("single_device", "te_fp8", "torch", "1", "")][0] == "refused"
    assert "transformer_engine" in rows[("single_device", "te_fp8", "torch", "1", "")][4]
    outcome, last, diff, _, why = rows[("ddp", "32", "dcp", "1", "3 steps + resume + 3")]
    assert outcome == "ok, resume exact" and float(diff) < 1e-5  # ddp on 1 = single_device
    # 2 replica groups of 1: their mean loss is the global batch's, on one process
    outcome, last, diff, _, why = rows[("ddp", "32", "torch", "1", "2 replica groups, gloo between")]
    assert outcome == "ok" and float(diff) < 1e-5
    outcome, *_, why = rows[("ddp", "32", "torch", "1", "2 replica groups, nccl between")]
    assert outcome == "refused" and "NCCL joins GPUs" in why
    assert ("ddp", "32", "torch", "1", "group 1 killed after step 3, heals") not in rows  # its own key: torchft-heal


def test_without_cuda_it_says_so():
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "run it on a machine with NVIDIA GPUs" in result.stderr


def load_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = gpu_check  # dataclasses look their module up
    spec.loader.exec_module(gpu_check)
    return gpu_check


def test_the_heal_rows_verdict(tmp_path):
    """The killed group must have started twice and healed, and every group end with the same weights."""
    import json

    gpu_check = load_script()
    heal = next(r for r in gpu_check.replica_group_rows(2) if r.heal)
    plain = next(r for r in gpu_check.replica_group_rows(2) if r.groups == 2 and not r.heal)
    assert heal.key == "ddp/32/torch/torchft-heal" and plain.key == "ddp/32/torch/torchft"

    def verdict(row, weights_agree, starts, heals):
        (tmp_path / "summary.json").write_text(json.dumps({"weights_agree": weights_agree, "replica_groups": [
            {"starts": 1}, {"starts": starts, "replicas": {"heals": [{"step": 4}] * heals}}]}))
        return gpu_check.replica_outcome(row, tmp_path)

    assert verdict(heal, True, 2, 1) == ""
    assert verdict(heal, True, 1, 0) == "group 1 started 1 time(s), healed 0 time(s)"
    assert verdict(heal, True, 2, 0) == "group 1 started 2 time(s), healed 0 time(s)"
    assert verdict(heal, False, 2, 1) == "the groups' final weights differ"
    assert verdict(plain, True, 1, 0) == ""  # nobody was killed


def test_a_failed_row_shows_the_exceptions_own_line():
    gpu_check = load_script()
    hydra_wrapped = ("Error executing job with overrides: ['x=1']\nTraceback (most recent call last):\n  File ...\n"
                     "ValueError: use_strided_shard_as_shard_order is True\n")
    assert gpu_check.failure_reason(hydra_wrapped) == "ValueError: use_strided_shard_as_shard_order is True"
    workers = "noise\nerror: worker rank 1 failed first: AttributeError: 'FlatParameter' object\nmore\n"
    assert gpu_check.failure_reason(workers) == "worker rank 1 failed first: AttributeError: 'FlatParameter' object"
