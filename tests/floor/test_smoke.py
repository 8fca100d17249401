"""The lowest torch pyproject.toml accepts (`make test-floor`, torch 2.9 in .venv-xla): every
strategy that runs on the CPU trains a few steps at two processes (one for single_device) and
resumes once exactly; the CPU-only refusals still say why. The main suite runs the same strategies
in depth under the pinned torch."""
from __future__ import annotations

import csv

import pytest
import torch

from framework.errors import RunExit
from tests.conftest import TINY_GPT, run_inprocess

pytestmark = pytest.mark.slow

STRATEGIES = ["single_device", "ddp", "ddp_spawn", "fsdp", "fsdp_cpu_offload", "hsdp", "model_parallel", "ddp_sharded",
              "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_2_offload", "deepspeed_stage_3",
              "deepspeed_stage_3_offload"]
BASE = [*TINY_GPT, "model.dropout=0.0", "trainer.log_every=1", "trainer.val_every=2", "trainer.val_at_start=false",
        "callbacks=[checkpoint]", "callbacks.checkpoint.every_n_steps=2"]


def _losses(out) -> list[float]:
    return [float(r["train/loss"]) for r in csv.DictReader(open(out / "metrics.csv")) if r.get("train/loss")]


def test_the_torch_is_the_floor():
    assert torch.__version__.split("+")[0].startswith("2.9"), torch.__version__


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_trains_and_resumes(strategy, tmp_path, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    world = [f"strategy={strategy}", f"devices={1 if strategy == 'single_device' else 2}"]
    run_inprocess([*BASE, *world, "trainer.max_steps=4"], tmp_path / "straight")
    straight = _losses(tmp_path / "straight")
    assert len(straight) == 4 and straight[-1] < straight[0]
    run_inprocess([*BASE, *world, "trainer.max_steps=2", "name=resumed"], tmp_path / "resumed")
    run_inprocess([*BASE, *world, "trainer.max_steps=4", "resume=auto", "name=resumed"], tmp_path / "resumed")
    torch.testing.assert_close(torch.tensor(_losses(tmp_path / "resumed")), torch.tensor(straight), rtol=0, atol=1e-6)


def test_a_cuda_only_strategy_is_refused_on_the_cpu(tmp_path, capsys):
    with pytest.raises(RunExit) as refused:
        run_inprocess([*BASE, "strategy=fairscale_fsdp", "devices=2", "trainer.max_steps=1"], tmp_path)
    assert refused.value.code == 2 and "needs CUDA" in capsys.readouterr().err
