"""Checkpoints written by main before the FSDP2 family became one mesh strategy (at 430f6ef:
tests/fixtures/checkpoints_430f6ef/README.md) resume under today's code: model_parallel's DCP
checkpoint with a fused layer's thirds, and model_parallel with pipeline stages (then built as
strategy=pipeline). The resumed steps log the losses and gradient norms that main's own run logged
after the same step."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import metric_values, run_inprocess

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints_430f6ef"
BASE = ["model.n_layer=2", "model.n_embd=16", "model.n_head=2", "model.block_size=16", "data.max_bytes=100000",
        "data.batch_size=8", "data.val_batch_size=16", "trainer.val_batches=1", "trainer.progress_bar=false",
        "trainer.plot=false", "trainer.max_steps=4", "trainer.log_every=1", "trainer.val_every=4", "model.dropout=0.0",
        "trainer.val_at_start=false", "callbacks=[checkpoint]", "callbacks.checkpoint.every_n_steps=2",
        "trainer.clip_grad_norm=0.5", "strategy=model_parallel", "devices=2"]
LAYOUTS = {"model_parallel_tp2_dcp": ["strategy.tensor_parallel_size=2", "checkpoint_io=dcp"],
           "model_parallel_pp2": ["strategy.pipeline_parallel_size=2"]}


@pytest.mark.slow
@pytest.mark.parametrize("name", LAYOUTS)
def test_a_checkpoint_of_the_older_main_resumes_where_its_run_went_on(tmp_path, name):
    expected = json.loads((FIXTURES / "expected.json").read_text())[name]
    run_inprocess([*BASE, *LAYOUTS[name], f"ckpt_path={FIXTURES / name}"], tmp_path)
    for key in ("train/loss", "train/grad_norm"):  # rtol: the machines' float kernels differ (AMX, AVX2)
        torch.testing.assert_close(torch.tensor(metric_values(tmp_path, key)), torch.tensor(expected[key]),
                                   rtol=1e-4, atol=1e-5)
