"""ZeRO-3's memory measures together: in float32 one copy of each rank's partition
(framework/strategy/deepspeed/master_weights.py), the optimizer stepped in sub groups, its zero
buffers made on demand and the gradient buffer given back after every step
(framework/strategy/deepspeed/grad_buffer.py); it still trains exactly like torch's own optimizer
on the unsharded model."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import copy, json, torch, deepspeed
from framework.models.mlp import MLP
from framework.strategy.deepspeed.grad_buffer import release_gradient_buffer, zeros_on_demand
from framework.strategy.deepspeed.master_weights import shared_master_partitions, shares_master_partitions
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
torch.manual_seed(0)
model = MLP()
reference = copy.deepcopy(model)
ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3, "sub_group_size": 8000},
          "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False}
with shared_master_partitions(), zeros_on_demand():
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
                                      config=config)
for step in range(3):
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(step))
    loss = engine(x).pow(2).mean(); engine.backward(loss); engine.step()
    released = release_gradient_buffer(engine.optimizer)
    buffer_zero = engine.optimizer.grad_partitions_flat_buffer.abs().sum().item() == 0
    ref_loss = reference(x).pow(2).mean(); ref_loss.backward(); ref_opt.step(); ref_opt.zero_grad()
with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
    diff = max((a - b).abs().max().item() for a, b in zip(engine.module.parameters(), reference.parameters()))
print(json.dumps({"shares": shares_master_partitions(engine.optimizer), "max_weight_diff": diff,
                  "sub_groups": len(engine.optimizer.fp16_groups), "released": released, "buffer_zero": buffer_zero,
                  "loss": loss.item(), "ref_loss": ref_loss.item()}))
"""


def run() -> dict:
    import json

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_weight_partition_is_the_master_partition_and_training_is_unchanged():
    result = run()
    assert result["shares"] and result["sub_groups"] == 3  # 8192 | 128 + 16384 | 128 + 1280 + 10, 8000 a group
    assert result["released"] and result["buffer_zero"]
    assert result["max_weight_diff"] < 1e-6 and abs(result["loss"] - result["ref_loss"]) < 1e-6
