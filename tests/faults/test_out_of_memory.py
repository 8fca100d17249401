"""A worker the kernel kills for memory (a cgroup v1 memory cap, as root) is reported as "rank N
was killed: out of memory", with what `framework plan` estimated per rank and what to try."""
from __future__ import annotations

import os
import sys

import pytest

from framework.errors import ExitCode
from framework.launch.oom import OomWatch
from tests.conftest import ROOT, TINY_GPT
from tests.helpers.memory_group import memory_group, run_in_group


@pytest.fixture
def memory_cap():
    with memory_group(1536 * 2**20) as group:
        yield group


@pytest.mark.slow
def test_a_worker_killed_for_memory_is_named_with_the_estimate(memory_cap, tmp_path):
    # ~100M parameters under ddp: 16 bytes each per rank (weights, gradients, Adam) > the 1.5 GiB cap
    args = [*TINY_GPT, "model.n_layer=12", "model.n_embd=768", "model.n_head=12", "strategy=ddp", "devices=2",
            "trainer.max_steps=3"]
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    result = run_in_group(memory_cap, f"{sys.executable} {ROOT}/train.py " + " ".join(args), cwd=tmp_path,
                          timeout=300, env=env)
    assert result.returncode == ExitCode.FAILED, (result.returncode, result.stdout[-2000:], result.stderr[-3000:])
    assert "was killed: out of memory (the kernel's out-of-memory killer" in result.stderr, result.stderr[-3000:]
    assert "memory limit 1.50 GiB" in result.stderr
    assert "framework plan estimated" in result.stderr and "per rank (ddp: 16" in result.stderr
    assert "strategy=fsdp or deepspeed_stage_3" in result.stderr


def test_the_watch_reads_this_machine_s_counters():
    watch = OomWatch()
    assert watch.kills() == 0  # nothing killed since the snapshot
