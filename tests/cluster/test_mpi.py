"""Processes started by a real `mpirun` (Open MPI, mpi4py): ranks, node layout and the
rendezvous come through MPI, and training matches the framework's own 2-process ddp exactly."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT, TINY_GPT, checkpoints, load_model_state
from tests.helpers.in_process import run_command
from tests.helpers.mpi_runtime import ensure_mpi, mpirun_prefix

pytestmark = pytest.mark.slow

ARGS = [*TINY_GPT, "strategy=ddp", "trainer.max_steps=6", "trainer.val_every=3", "logger=[csv]"]
ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def mpi():
    reason = ensure_mpi()
    if reason:
        pytest.skip(reason)


def mpirun_train(args: list[str], cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, **ENV}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([*mpirun_prefix(), sys.executable, str(ROOT / "train.py"), *ARGS, *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def test_mpirun_trains_like_the_local_launcher(mpi, tmp_path):
    result = mpirun_train(["cluster=mpi", "devices=2"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    [via_mpi] = (tmp_path / "outputs").glob("mpi-*")  # named after the MPI job: every rank agrees
    reference = run_command(["train", *ARGS, "devices=2", "name=local"], tmp_path, env=ENV)  # the local launcher, in this process
    assert reference.returncode == 0, reference.stderr
    local = tmp_path / "outputs" / "local"
    assert (via_mpi / "metrics.csv").read_text().splitlines()[1:3] == (local / "metrics.csv").read_text().splitlines()[1:3]
    a, b = load_model_state(checkpoints(via_mpi)[-1]), load_model_state(checkpoints(local)[-1])
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_cluster_auto_detects_mpirun_and_checks_the_layout(mpi, tmp_path):
    result = mpirun_train(["devices=1", "num_nodes=2"], tmp_path)
    assert result.returncode == 2
    assert "num_nodes=2, but mpirun placed the 2 process(es) on 1 node(s): set num_nodes=1" in result.stderr
