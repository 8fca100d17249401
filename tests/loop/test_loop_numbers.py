"""The loop's numbers: accumulation, validation totals, schedules, stopping conditions."""
from __future__ import annotations

import csv
import json

import pytest
import torch

from tests.conftest import DIGITS, checkpoints, load_model_state, run_inprocess


def _final_weights(tmp_path, name, extra):
    out = tmp_path / name
    run_inprocess([*DIGITS, "trainer.val_every=1000", "trainer.val_at_start=false",
                   "scheduler=constant", "trainer.clip_grad_norm=null", *extra], out)
    return load_model_state(checkpoints(out)[-1])


@pytest.mark.matrix(strategy="single_device", precision="64")
def test_accumulating_k_micro_batches_equals_one_batch_k_times_larger(tmp_path):
    """4 micro-batches of 8 with accumulate=4 take the same steps as batches of 32: the sampler
    yields the same permutation, and each micro-loss is divided by 4."""
    # float64 so that only the summation order differs and the bound can be tight
    a = _final_weights(tmp_path, "acc", ["precision=64", "data.batch_size=8", "trainer.accumulate=4", "trainer.max_steps=6"])
    b = _final_weights(tmp_path, "big", ["precision=64", "data.batch_size=32", "trainer.accumulate=1", "trainer.max_steps=6"])
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-10, atol=1e-12)
        assert a[key].dtype == torch.float64
    c = _final_weights(tmp_path, "small", ["precision=64", "data.batch_size=8", "trainer.accumulate=1", "trainer.max_steps=6"])
    assert not torch.allclose(c["net.0.weight"], b["net.0.weight"])  # the comparison can fail


def test_max_epochs_and_short_last_accumulation_group(tmp_path):
    """1077 training images / 64 = 16 batches (drop_last); accumulate=5 makes groups of
    5,5,5,1, so one epoch is 4 optimizer steps and two epochs are 8."""
    out = tmp_path / "run"
    run_inprocess([*DIGITS, "trainer.max_steps=null", "trainer.max_epochs=2", "trainer.accumulate=5",
                   "trainer.val_every=1000"], out)
    assert checkpoints(out)[-1].name == "step_000008"
    meta = json.loads((checkpoints(out)[-1] / "meta.json").read_text())
    assert (meta["step"], meta["epoch"]) == (8, 2)


def test_validation_totals_cover_the_whole_val_set_and_metrics_are_logged(tmp_path):
    out = tmp_path / "run"
    objective = run_inprocess([*DIGITS, "trainer.max_steps=60", "trainer.val_every=20", "trainer.val_batches=null",
                               "callbacks=[checkpoint,lr_monitor]", "optimizer.lr=3e-3"], out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["objective"] == "val/loss" and summary["objective_value"] == objective
    assert summary["metrics"]["val/accuracy"] > 0.85  # digits are easy
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    val_steps = [int(r["step"]) for r in rows if r.get("val/loss")]
    assert val_steps == [0, 20, 40, 60]
    losses = [float(r["val/loss"]) for r in rows if r.get("val/loss")]
    assert losses[-1] < losses[0] * 0.5
    lrs = [float(r["lr/pg0"]) for r in rows if r.get("lr/pg0")]
    assert lrs[0] < lrs[-2]  # warm-up: the LR rises first


def test_cosine_schedule_reaches_min_ratio(tmp_path):
    out = tmp_path / "run"
    run_inprocess([*DIGITS, "trainer.max_steps=40", "scheduler.warmup_steps=10", "scheduler.min_lr_ratio=0.1",
                   "optimizer.lr=0.01", "trainer.log_every=1"], out)
    rows = [r for r in csv.DictReader(open(out / "metrics.csv")) if r.get("lr/pg0")]
    lr = {int(r["step"]): float(r["lr/pg0"]) for r in rows}
    assert lr[1] == pytest.approx(0.01 * 2 / 10)  # after one step: warm-up step 2 of 10
    assert lr[40] == pytest.approx(0.001)


def test_objective_is_returned(tmp_path):
    value = run_inprocess([*DIGITS, "trainer.max_steps=5", "trainer.objective=val/accuracy"], tmp_path / "r")
    assert isinstance(value, float) and 0.0 <= value <= 1.0


def test_epoch_interval_scheduler_steps_once_per_epoch(tmp_path):
    """16 batches per epoch; StepLR(step_size=1, gamma=0.5) per epoch halves the LR at 16 and 32."""
    out = tmp_path / "run"
    run_inprocess([*DIGITS, "trainer.max_steps=50", "trainer.log_every=1", "scheduler=step",
                   "scheduler.step_size=1", "optimizer.lr=0.01", "trainer.val_every=1000"], out)
    lr = {int(r["step"]): float(r["lr/pg0"]) for r in csv.DictReader(open(out / "metrics.csv")) if r.get("lr/pg0")}
    assert lr[16] == pytest.approx(0.01) and lr[17] == pytest.approx(0.005)
    assert lr[32] == pytest.approx(0.005) and lr[33] == pytest.approx(0.0025)


def test_deterministic_runs_repeat_exactly(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        run_inprocess([*DIGITS, "trainer.max_steps=5", "trainer.deterministic=true", "model.dropout=0.3"], out)
    wa, wb = load_model_state(checkpoints(a)[-1]), load_model_state(checkpoints(b)[-1])
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not torch.are_deterministic_algorithms_enabled()  # restored when the run ended


def test_tensor_valued_training_values_and_validation_sums_are_logged_per_element(tmp_path, monkeypatch):
    """A step may return per-class counts: a training value is logged as train/<key>/<i> (mean per
    batch over the logging window), a validation sum adds up as a tensor."""
    monkeypatch.setenv("FRAMEWORK_TRUST_ALLOW", "tests.helpers.")
    out = tmp_path / "run"
    run_inprocess([*DIGITS, "task._target_=tests.helpers.class_counts.ClassificationWithCounts", "trainer.max_steps=10",
                   "trainer.val_every=5", "trainer.objective=val/macro_recall"], out)
    rows = [r for r in csv.DictReader(open(out / "metrics.csv")) if r.get("train/predicted/0")]
    assert [r["step"] for r in rows] == ["5", "10"]
    for row in rows:  # each batch predicts 64 classes in all
        assert sum(float(row[f"train/predicted/{c}"]) for c in range(10)) == pytest.approx(64.0)
    recalls = [float(r["val/macro_recall"]) for r in csv.DictReader(open(out / "metrics.csv")) if r.get("val/macro_recall")]
    assert len(recalls) == 3 and all(0.0 <= value <= 1.0 for value in recalls)
