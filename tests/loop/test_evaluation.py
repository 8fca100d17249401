"""Evaluation metrics do not depend on the world size: the same weights score the same samples,
exactly once each, at 1, 2 and 4 processes under ddp, fsdp, ZeRO-3, hsdp and model_parallel (whose
tensor-parallel ranks score one batch together, counted once) (framework/loop/evaluation.py,
framework/data/loaders.py)."""
from __future__ import annotations

import csv

import pytest
import torch

from framework.loop.evaluation import evaluate
from framework.strategy.single_device import SingleDeviceStrategy
from tests.conftest import TINY_GPT, checkpoints, run_inprocess

# 5 global batches of 2: 10 samples; at 4 ranks the shares are 3, 3, 2, 2 samples, so two ranks run
# one more (unscored) forward pass than they have batches for
EVAL = ["data.val_batch_size=2", "trainer.val_batches=5", "trainer.max_steps=1", "trainer.val_at_start=true",
        "trainer.log_every=1", "model.dropout=0.1"]


def _first_validation(run) -> dict[str, float]:
    with open(run / "metrics.csv") as f:
        row = next(r for r in csv.DictReader(f) if r["step"] == "0" and r.get("val/loss"))
    return {k: float(v) for k, v in row.items() if k.startswith("val/")}


@pytest.mark.slow
def test_one_checkpoint_scores_the_same_at_any_world_size(tmp_path):
    run_inprocess([*TINY_GPT, "trainer.max_steps=3"], tmp_path / "base")
    weights = checkpoints(tmp_path / "base")[-1] / "model.pt"
    runs = {"single_device@1": ["strategy=single_device"], "ddp@2": ["strategy=ddp", "devices=2"],
            "fsdp@2": ["strategy=fsdp", "devices=2"], "fsdp@4": ["strategy=fsdp", "devices=4"],
            "deepspeed_stage_3@2": ["strategy=deepspeed_stage_3", "devices=2"],
            "hsdp@4": ["strategy=hsdp", "devices=4", "strategy.shard_size=2"],
            "model_parallel@4": ["strategy=model_parallel", "devices=4", "strategy.tensor_parallel_size=2"]}
    scores = {}
    for name, overrides in runs.items():
        run_name = name.replace("@", "_")
        run_inprocess([*TINY_GPT, *EVAL, *overrides, f"ckpt_path={weights}"], tmp_path / run_name)
        scores[name] = _first_validation(tmp_path / run_name)
    reference = scores["single_device@1"]
    assert set(reference) == {"val/loss", "val/perplexity"} and 3 < reference["val/loss"] < 6
    for name, score in scores.items():
        for key, value in reference.items():
            assert score[key] == pytest.approx(value, rel=1e-6, abs=1e-6), (name, key, score[key], value)


class _Counting(torch.nn.Module):
    """Returns its input: the sums say exactly which samples were scored, and how often."""

    def forward(self, x):
        return x


def test_every_sample_is_scored_once_and_tensor_valued_sums_keep_their_shape():
    strategy = SingleDeviceStrategy()
    loader = torch.utils.data.DataLoader(torch.arange(10.0), batch_size=4)

    def step(model, batch):
        values = model(batch)
        return {"sum": values.sum(), "count": torch.tensor(float(len(values))),
                "per_class": torch.stack([(values % 2 == 0).sum(), (values % 2 == 1).sum()]).float()}

    totals = evaluate(strategy, _Counting(), loader, step)
    assert totals["sum"].item() == 45.0 and totals["count"].item() == 10.0
    assert totals["per_class"].tolist() == [5.0, 5.0] and totals["per_class"].dtype == torch.float64


def test_loader_workers_are_stopped_when_an_evaluation_or_a_fit_leaves_its_loader():
    """A StatefulDataLoader keeps its last iterator; an evaluation takes exactly len(loader) batches
    and a fit stops at max_steps mid-epoch, so neither reaches the iterator's end, and its workers
    lived until garbage collection, which waited 5 s for each before killing it (framework/data/
    loaders.py release_workers). Here they have exited when evaluate returns."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from framework.data.loaders import release_workers

    loader = StatefulDataLoader(torch.arange(16.0), batch_size=4, num_workers=2)
    totals = evaluate(SingleDeviceStrategy(), _Counting(), loader, lambda model, batch: {"sum": model(batch).sum()})
    assert totals["sum"].item() == 120.0
    assert not any(worker.is_alive() for worker in loader._iterator._workers)
    batches = iter(loader)  # a training pass left mid-epoch
    next(batches)
    assert all(worker.is_alive() for worker in batches._workers)
    release_workers(loader)
    assert not any(worker.is_alive() for worker in batches._workers)
    release_workers(torch.utils.data.DataLoader(torch.arange(4.0)))  # a plain loader: nothing to stop
