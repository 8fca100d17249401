"""trainer.on_nonfinite: a run whose loss or gradients go NaN/inf stops (exit code 3) without
writing non-finite weights and keeps its finite checkpoints; `skip` leaves such steps out (up to
nonfinite_skip_limit in a row); `warn` trains on, marking its non-finite checkpoints and never
rotating the last finite one away. A sweep records a diverged job as failed and goes on."""
from __future__ import annotations

import csv
import json

import pytest
import torch

from framework.checkpoint.format import read_meta
from framework.errors import ExitCode, RunExit
from framework.loop.nonfinite import NonFiniteGuard
from framework.tasks.language_modeling import LanguageModeling
from tests.conftest import TINY_GPT, checkpoints, load_model_state, run_inprocess, run_train
from tests.helpers.in_process import run_command

BASE = [*TINY_GPT, "trainer.log_every=1", "trainer.val_every=100", "trainer.val_at_start=false",
        "callbacks=[checkpoint]", "callbacks.checkpoint.every_n_steps=1", "callbacks.checkpoint.keep_last_k=1",
        "callbacks.checkpoint.best_k=0"]


def _summary(out) -> dict:
    return json.loads((out / "summary.json").read_text())


def _column(out, key) -> list[str]:
    return [r[key] for r in csv.DictReader(open(out / "metrics.csv")) if r.get(key)]


def _finite(checkpoint) -> bool:
    return all(torch.isfinite(v).all() for v in load_model_state(checkpoint).values() if v.is_floating_point())


def _nan_from(monkeypatch, first_call: int, last_call: int | None = None):
    """The language-modeling loss NaN from its `first_call`-th training step (1-based) on, up to
    `last_call`: a run that diverges where the test says."""
    calls = {"n": 0}
    original = LanguageModeling.training_sums

    def training_sums(self, model, batch):
        loss, count = original(self, model, batch)
        if loss.is_meta:  # the check before launch (framework/tasks/fit_check.py), not a step
            return loss, count
        calls["n"] += 1
        bad = calls["n"] >= first_call and (last_call is None or calls["n"] <= last_call)
        return (loss * float("nan") if bad else loss), count

    monkeypatch.setattr(LanguageModeling, "training_sums", training_sums)


def test_stop_keeps_the_finite_checkpoints_and_writes_no_other(tmp_path, monkeypatch, capsys):
    _nan_from(monkeypatch, 4)
    with pytest.raises(RunExit) as stopped:
        run_inprocess([*BASE, "trainer.max_steps=8"], tmp_path)
    assert stopped.value.code == ExitCode.DIVERGED == 3
    saved = checkpoints(tmp_path)
    # one checkpoint a step, keep_last_k=1: the step-3 checkpoint, the last finite one, is what is left
    assert [c.name for c in saved] == ["step_000003"] and _finite(saved[0]) and read_meta(saved[0])["finite"]
    summary = _summary(tmp_path)
    assert summary["status"] == "diverged" and summary["objective_value"] is None
    assert summary["diverged"] == {"what": "the training loss", "step": 4, "stopped_at": 4, "policy": "stop",
                                   "last_finite_checkpoint": str(saved[0])}
    said = capsys.readouterr().err
    assert "the training loss was non-finite at step 4" in said and f"ckpt_path={saved[0]}" in said
    assert "optimizer.lr" in said and "trainer.on_nonfinite=skip" in said
    assert all(v != "nan" for v in _column(tmp_path, "train/loss"))  # nothing non-finite was logged


def test_skip_leaves_the_step_out_and_the_run_goes_on(tmp_path, monkeypatch):
    _nan_from(monkeypatch, 3, 3)
    run_inprocess([*BASE, "trainer.max_steps=5", "trainer.on_nonfinite=skip", "callbacks.checkpoint.keep_last_k=5"],
                  tmp_path)
    saved = {c.name: c for c in checkpoints(tmp_path)}
    before, skipped = load_model_state(saved["step_000002"]), load_model_state(saved["step_000003"])
    assert all(torch.equal(before[k], skipped[k]) for k in before)  # step 3 changed no weight
    assert all(_finite(c) for c in saved.values()) and _summary(tmp_path)["status"] == "completed"
    assert _column(tmp_path, "train/skipped_step") == ["1.0"]
    assert len(_column(tmp_path, "train/loss")) == 4 and "nan" not in _column(tmp_path, "train/loss")


def test_skip_stops_after_the_limit_of_skips_in_a_row(tmp_path, monkeypatch, capsys):
    _nan_from(monkeypatch, 2)
    with pytest.raises(RunExit) as stopped:
        run_inprocess([*BASE, "trainer.max_steps=10", "trainer.on_nonfinite=skip", "trainer.nonfinite_skip_limit=3"],
                      tmp_path)
    assert stopped.value.code == ExitCode.DIVERGED
    assert _summary(tmp_path)["diverged"]["stopped_at"] == 4
    assert "the gradients were non-finite 3 steps in a row" in capsys.readouterr().err


def test_warn_trains_on_and_never_rotates_the_last_finite_checkpoint_away(tmp_path, monkeypatch, capsys):
    _nan_from(monkeypatch, 3)
    run_inprocess([*BASE, "trainer.max_steps=5", "trainer.on_nonfinite=warn"], tmp_path)
    saved = checkpoints(tmp_path)
    assert [c.name for c in saved] == ["step_000002", "step_000005"]  # the newest, and the newest finite
    assert read_meta(saved[0])["finite"] and _finite(saved[0]) and not read_meta(saved[1])["finite"]
    err = capsys.readouterr().err
    assert err.count("WARNING: the training loss became non-finite at step 3; training goes on (trainer.on_nonfinite=warn)") == 1
    assert _summary(tmp_path)["status"] == "completed"


def test_a_loss_scalers_skips_count_and_stop_the_run_after_the_limit():
    guard = NonFiniteGuard("stop", 3, torch.device("cpu"), distributed=False, scaled=True)
    for step in (1, 2):
        guard.observe_gradients(step, torch.tensor(float("inf")), stepped=False)  # the scaler skipped them
        assert guard.too_many_skips() is None and guard.local_verdict() is None  # overflow is the scaler's business
    guard.observe_gradients(3, torch.tensor(float("inf")), stepped=False)
    assert "fp16's loss scaler skipped them" in guard.too_many_skips()
    guard.observe_gradients(4, torch.tensor(1.0), stepped=True)
    assert guard.too_many_skips() is None and guard.skipped == 3  # in a row: a taken step starts again
    warned = NonFiniteGuard("warn", 1, torch.device("cpu"), distributed=False, scaled=True)
    warned.observe_gradients(1, torch.tensor(float("inf")), stepped=False)
    assert warned.too_many_skips() is None  # warn never stops


def test_16_true_trains(tmp_path, capsys):
    """float16 cannot hold AdamW's eps of 1e-8 (it is 0 there): raised to float16's smallest
    normal number, said once; the loss then falls, at least as far as under bf16_true."""
    losses = {}
    for precision in ("16_true", "bf16_true"):
        run_inprocess([*TINY_GPT, "trainer.log_every=1", "trainer.val_at_start=false", "callbacks=[]",
                       "trainer.max_steps=12", f"precision={precision}"], tmp_path / precision)
        losses[precision] = [float(v) for v in _column(tmp_path / precision, "train/loss")]
    assert "raised to 6.1e-05, the smallest normal float16 number" in capsys.readouterr().out
    half = losses["16_true"]
    assert len(half) == 12 and half[-1] < half[0] - 0.5
    assert half[-1] <= losses["bf16_true"][-1] + 0.1  # at least as far as bf16_true (further: 3 more mantissa bits)


@pytest.mark.slow
def test_two_processes_stop_together_where_they_meet_and_a_sweep_goes_on(tmp_path):
    """ddp@2 at lr=1e4: both ranks stop at the same step (the logging all-reduce, a checkpoint),
    exit code 3; in a sweep the job is recorded as diverged and the other job's result stands."""
    args = [*BASE, "trainer.log_every=4", "callbacks.checkpoint.every_n_steps=4", "trainer.max_steps=40",
            "optimizer.lr=1e4", "strategy=ddp", "devices=2", "name=ddp"]
    result = run_train(args, tmp_path)
    assert result.returncode == 3, result.stderr[-2000:]
    summary = _summary(tmp_path / "outputs" / "ddp")
    assert summary["diverged"]["stopped_at"] % 4 == 0 and summary["diverged"]["stopped_at"] < 40
    assert all(_finite(c) for c in checkpoints(tmp_path / "outputs" / "ddp"))
    sweep = run_command(["train", "-m", *BASE, "trainer.max_steps=6", "optimizer.lr=3e-3,1e6", "hydra.sweep.dir=sweep"],
                        tmp_path)  # one-process jobs: through the command's own entry in this process
    assert sweep.returncode == 0, sweep.stderr[-2000:]
    rows = {r["job"]: r for r in csv.DictReader(open(tmp_path / "sweep" / "sweep_summary.csv"))}
    assert rows["0"]["status"] == "completed" and rows["1"]["status"] == "diverged"
    assert "job 1 diverged" in sweep.stdout + sweep.stderr
