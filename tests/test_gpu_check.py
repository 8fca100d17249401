"""benchmarks/gpu_check.py (`make gpu-check`) checked on the CPU, so the script is ready the day a
GPU is lent: a row that trains, a refused one with its reason, a resume compared bit for bit,
replica groups and their heal, and the refusal to run without CUDA."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def test_the_gpu_check_runs_its_rows_on_the_cpu(tmp_path):
    table = tmp_path / "table.md"
    result = subprocess.run([sys.executable, str(SCRIPT), "--accelerator", "cpu", "--rows",
                             "single_device/32/torch,single_device/te_fp8/torch,ddp/32/dcp,ddp/32/torch/torchft", "--out",
                             str(table)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {tuple(c.strip() for c in line.split("|")[1:6]): [c.strip() for c in line.split("|")[6:-1]]
            for line in table.read_text().splitlines()[4:]}
    outcome, last, diff, _, why = rows[("single_device", "32", "torch", "1", "")]
    # the CPU against itself: two runs of one job, within float32 rounding (bit-equal on an idle
    # machine; 4.8e-07 apart once on an AMX CPU under load, see README "Reproducibility")
    assert outcome == "ok" and float(diff) < 1e-5
    assert rows[("single_device", "te_fp8", "torch", "1", "")][0] == "refused"
    assert "transformer_engine" in rows[("single_device", "te_fp8", "torch", "1", "")][4]
    outcome, last, diff, _, why = rows[("ddp", "32", "dcp", "2", "3 steps + resume + 3")]
    assert outcome == "ok, resume exact" and float(diff) < 1e-5  # ddp on 2 = single_device on the global batch
    # 2 replica groups of 1: their mean loss is the global batch's, on one process
    outcome, last, diff, _, why = rows[("ddp", "32", "torch", "1", "2 replica groups, gloo between")]
    assert outcome == "ok" and float(diff) < 1e-5
    outcome, *_, why = rows[("ddp", "32", "torch", "1", "2 replica groups, nccl between")]
    assert outcome == "refused" and "NCCL joins GPUs" in why
    outcome, last, *_ = rows[("ddp", "32", "torch", "1", "group 1 killed after step 3, heals")]
    assert outcome == "ok, healed" and float(last) < 5.0, rows  # healed, the same final weights, the loss fallen


def test_without_cuda_it_says_so():
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "run it on a machine with NVIDIA GPUs" in result.stderr


def test_a_failed_row_shows_the_exceptions_own_line():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = gpu_check  # dataclasses look their module up
    spec.loader.exec_module(gpu_check)
    hydra_wrapped = ("Error executing job with overrides: ['x=1']\nTraceback (most recent call last):\n  File ...\n"
                     "ValueError: use_strided_shard_as_shard_order is True\n")
    assert gpu_check.failure_reason(hydra_wrapped) == "ValueError: use_strided_shard_as_shard_order is True"
    workers = "noise\nerror: worker rank 1 failed first: AttributeError: 'FlatParameter' object\nmore\n"
    assert gpu_check.failure_reason(workers) == "worker rank 1 failed first: AttributeError: 'FlatParameter' object"
