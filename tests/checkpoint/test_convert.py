"""`framework convert`: export weights for inference; import a DeepSpeed native checkpoint."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import DIGITS, ROOT, TINY_GPT, checkpoints, load_model_state, run_inprocess
from tests.helpers.in_process import run_command


def convert(*args):
    """`framework convert ARGS` as typed, through the command's own entry in this process."""
    return run_command(["convert", *args], ROOT)


@pytest.fixture(scope="module")
def gpt_checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpt")
    run_inprocess([*TINY_GPT, "trainer.max_steps=2", "logger=null"], out)
    return checkpoints(out)[-1]


@pytest.mark.parametrize("given", ["checkpoint", "run directory"])
def test_export_torch(tmp_path, gpt_checkpoint, given):
    source = gpt_checkpoint if given == "checkpoint" else gpt_checkpoint.parent.parent  # its best (the only) one
    result = convert(str(source), "--to", "torch", str(tmp_path / "w.pt"))
    assert result.returncode == 0, result.stderr
    assert (f"framework convert: {gpt_checkpoint} (" in result.stdout) == (given == "run directory")
    exported = torch.load(tmp_path / "w.pt", weights_only=True)
    want = load_model_state(gpt_checkpoint)
    assert set(exported) == set(want) and all(torch.equal(exported[k], want[k]) for k in want)


def test_export_safetensors_with_tied_weights(tmp_path, gpt_checkpoint):
    from safetensors.torch import load_file

    result = convert(str(gpt_checkpoint), "--to", "safetensors", str(tmp_path / "w.safetensors"))
    assert result.returncode == 0, result.stderr
    exported = load_file(tmp_path / "w.safetensors")
    want = load_model_state(gpt_checkpoint)
    assert "head.weight" not in exported  # tied to tok_emb.weight, stored once
    assert all(torch.equal(exported[k], want[k]) for k in exported)


def test_export_a_sharded_dcp_checkpoint(tmp_path):
    run_inprocess([*TINY_GPT, "trainer.max_steps=2", "logger=null", "checkpoint_io=dcp"], tmp_path / "run")
    ckpt = checkpoints(tmp_path / "run")[-1]
    assert (ckpt / "state" / ".metadata").is_file() and not (ckpt / "model.pt").exists()
    result = convert(str(ckpt), "--to", "torch", str(tmp_path / "w.pt"))
    assert result.returncode == 0, result.stderr
    exported = torch.load(tmp_path / "w.pt", weights_only=True)
    want = load_model_state(ckpt)
    assert set(exported) == set(want) and all(torch.equal(exported[k], want[k]) for k in want)


def test_convert_errors(tmp_path):
    missing = convert(str(tmp_path / "nope"), "--to", "torch", str(tmp_path / "w.pt"))
    assert missing.returncode == 2 and "nope: no such directory; give a run directory" in missing.stderr


@pytest.mark.slow
def test_import_a_deepspeed_native_checkpoint_and_train_from_it(tmp_path):
    """A ZeRO-2 engine saves natively; the import holds its exact fp32 weights and a run starts
    from it."""
    script = f"""
import os, torch, deepspeed
from framework.models.mlp import MLP
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
torch.manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config={{"train_micro_batch_size_per_gpu": 4,
    "zero_optimization": {{"stage": 2}}, "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False}})
loss = engine(torch.randn(4, 64)).sum(); engine.backward(loss); engine.step()
engine.save_checkpoint({str(tmp_path / 'ds')!r})
torch.save({{k: v.detach().clone() for k, v in engine.module.state_dict().items()}}, {str(tmp_path / 'want.pt')!r})
"""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29731", "PYTHONPATH": str(ROOT)}
    made = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    result = convert(str(tmp_path / "ds"), "--from", "deepspeed", str(tmp_path / "imported"))
    assert result.returncode == 0, result.stderr
    imported = torch.load(tmp_path / "imported" / "model.pt", weights_only=True)
    want = torch.load(tmp_path / "want.pt", weights_only=True)
    assert all(torch.equal(imported[k], want[k]) for k in want)
    run_inprocess([*DIGITS, "trainer.max_steps=3", f"ckpt_path={tmp_path / 'imported'}"], tmp_path / "run")
    assert (tmp_path / "run" / "summary.json").is_file()
