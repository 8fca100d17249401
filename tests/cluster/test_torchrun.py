"""Processes started by a real torchrun: two "nodes" on this machine (one process each, c10d
rendezvous on 127.0.0.1) train exactly like 2-process ddp on one node."""
from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import TINY_GPT, load_model_state
from tests.helpers.in_process import run_command
from tests.helpers.torchrun import free_port, torchrun

pytestmark = pytest.mark.slow

ARGS = [*TINY_GPT, "strategy=ddp", "trainer.max_steps=6", "trainer.val_every=3", "logger=[csv]"]


def losses(run_dir) -> list[tuple[str, str]]:
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    keep = [header.index("train/loss"), header.index("val/loss")]
    return [tuple(row.split(",")[i] for i in keep) for row in rows[1:]]


def test_two_nodes_train_like_one_node(tmp_path):
    port = free_port()
    node = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"127.0.0.1:{port}", "--rdzv-id", "twonodes"]
    nodes = [torchrun(node, [*ARGS, "devices=1", "num_nodes=2"], tmp_path) for _ in range(2)]
    outputs = [p.communicate(timeout=400)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(outputs)
    two_nodes = tmp_path / "outputs" / "torchrun-twonodes"  # the run is named after the rendezvous id
    reference = run_command(["train", *ARGS, "devices=2", "name=one_node"], tmp_path)  # the local launcher, in this process
    assert reference.returncode == 0, reference.stderr
    one_node = tmp_path / "outputs" / "one_node"
    assert losses(two_nodes) == losses(one_node)
    a = load_model_state(two_nodes / "checkpoints" / "step_000006")
    b = load_model_state(one_node / "checkpoints" / "step_000006")
    assert all(torch.equal(a[k], b[k]) for k in a)
    summary = json.loads((two_nodes / "summary.json").read_text())  # written by global rank zero
    assert summary["world_size"] == 2 and summary["objective_value"] == float([v for _, v in losses(one_node) if v][-1])


def test_a_torchrun_world_that_disagrees_with_devices_is_refused(tmp_path):
    result = torchrun(["--standalone", "--nproc-per-node", "2"], [*ARGS, "devices=1"], tmp_path)
    output = result.communicate(timeout=300)[0]
    assert result.returncode != 0
    assert "devices=1, but torchrun starts 2 process(es) per node (--nproc-per-node=2): set devices=2" in output
