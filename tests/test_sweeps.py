"""Sweeps (-m): a failed job is recorded and the sweep goes on; sweep_summary.csv and a table,
best first; multi-process jobs; re-running the command with resume=auto skips finished jobs and
resumes unfinished ones from their checkpoints; Optuna records failed trials."""
from __future__ import annotations

import csv
import json
import shutil
import textwrap

import pytest

from framework.sweeps import rank_rows
from tests.cli.helpers import framework_cmd
from tests.conftest import TINY_GPT, run_train
from tests.helpers.in_process import run_command

SHORT = ["trainer.val_batches=1", "trainer.progress_bar=false"]


def run_sweep(args: list[str], cwd):
    """`python train.py -m ARGS` through its own entry in this process (one-process jobs; the
    multi-process sweep below is a fresh interpreter's)."""
    return run_command(["train", *args], cwd)


def summary_rows(sweep_dir):
    with open(sweep_dir / "sweep_summary.csv") as f:
        return list(csv.DictReader(f))


def metric_rows(run_dir):
    with open(run_dir / "metrics.csv") as f:
        return [(r["step"], r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")]


def test_ranking_puts_the_best_first_and_failures_last():
    rows = [{"value": 2.0}, {"value": None}, {"value": 1.0}, {"value": 3.0}]
    assert [r["value"] for r in rank_rows(rows, "min")] == [1.0, 2.0, 3.0, None]
    assert [r["value"] for r in rank_rows(rows, "max")] == [3.0, 2.0, 1.0, None]


@pytest.mark.slow
def test_a_failed_job_is_recorded_and_the_sweep_goes_on(tmp_path):
    # max_bytes=100 passes every check made before launch, and fails in the job (too little text)
    result = run_sweep(["-m", "name=s", *TINY_GPT, *SHORT, "data.max_bytes=100,300000,200000", "trainer.max_steps=2",
                    "trainer.val_every=2"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = summary_rows(tmp_path / "multirun" / "s")
    assert [r["status"] for r in rows] == ["completed", "completed", "failed"]
    failed = rows[-1]
    assert failed["job"] == "0" and "data.max_bytes=100" in failed["overrides"] and "too little to fill" in failed["error"]
    values = [float(r["value"]) for r in rows[:2]]
    assert values == sorted(values)  # best (lowest val/loss) first
    for row in rows[:2]:
        summary = json.loads((tmp_path / "multirun" / "s" / row["job"] / "summary.json").read_text())
        assert summary["objective_value"] == pytest.approx(float(row["value"]))
    # the table printed at the end: overrides -> objective, status, time, best first
    table = result.stdout[result.stdout.index("#  job"):]
    assert table.index("completed") < table.index("failed") and "val/loss (min)" in table
    assert "every job:" in result.stdout and "sweep summary:" in result.stdout


@pytest.mark.slow
def test_a_sweep_whose_every_job_failed_exits_1(tmp_path):
    result = run_sweep(["-m", "name=bad", *TINY_GPT, *SHORT, "data.max_bytes=100,200", "trainer.max_steps=1"], tmp_path)
    assert result.returncode == 1
    assert [r["status"] for r in summary_rows(tmp_path / "multirun" / "bad")] == ["failed", "failed"]


@pytest.mark.slow
def test_a_sweep_with_a_value_refused_before_launch_starts_no_job(tmp_path):
    result = run_sweep(["-m", "name=early", *TINY_GPT, "model.n_head=2,3"], tmp_path)
    assert result.returncode == 2 and "model.n_head=3 must divide model.n_embd=32" in result.stderr
    assert not (tmp_path / "multirun").exists()


@pytest.mark.slow
def test_multi_process_jobs_in_a_sweep(tmp_path):
    result = run_train(["-m", "name=mp", "strategy=ddp,fsdp", "devices=2", "trainer.max_steps=3", "trainer.val_every=3",
                        *TINY_GPT, *SHORT], tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = summary_rows(tmp_path / "multirun" / "mp")
    assert sorted(o for r in rows for o in r["overrides"].split() if o.startswith("strategy=")) == [
        "strategy=ddp", "strategy=fsdp"]
    assert all(r["status"] == "completed" for r in rows)
    ddp, fsdp = (float(r["value"]) for r in sorted(rows, key=lambda r: "fsdp" in r["overrides"]))
    assert ddp == pytest.approx(fsdp, abs=1e-4)  # the same training, sharded or not
    for job in ("0", "1"):
        assert json.loads((tmp_path / "multirun" / "mp" / job / "summary.json").read_text())["world_size"] == 2
        assert not [p for p in (tmp_path / "multirun" / "mp" / job).iterdir() if p.name.startswith("elastic-")]
    assert not (tmp_path / "outputs").exists()  # a sweep writes under multirun/ only


@pytest.mark.slow
def test_rerunning_a_sweep_with_resume_auto_skips_finished_and_resumes_unfinished(tmp_path):
    command = ["-m", "optimizer.lr=1e-3,3e-3", "trainer.max_steps=4", "trainer.val_every=2",
               "callbacks.checkpoint.every_n_steps=2", "callbacks.checkpoint.keep_last_k=3", *TINY_GPT, *SHORT,
               "trainer.log_every=1"]
    first = run_sweep(command, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    (sweep,) = [p.parent for p in (tmp_path / "multirun").rglob("sweep.yaml")]
    finished, unfinished = sweep / "0", sweep / "1"
    original = metric_rows(unfinished)
    finished_summary = (finished / "summary.json").read_text()
    # job 1 "died" after its step-2 checkpoint: no summary, no later checkpoint
    (unfinished / "summary.json").unlink()
    shutil.rmtree(unfinished / "checkpoints" / "step_000004")
    again = run_sweep([*command, "resume=auto"], tmp_path)  # the same command, no name: the sweep is found
    assert again.returncode == 0, again.stderr[-3000:]
    assert "job 0" in again.stdout and "skipped" in again.stdout
    assert f"resumed from {unfinished / 'checkpoints' / 'step_000002'}" in again.stdout
    assert (finished / "summary.json").read_text() == finished_summary  # untouched
    assert metric_rows(unfinished) == original  # resumed exactly: the same losses as the undisturbed job
    assert [r["status"] for r in summary_rows(sweep)] == ["completed", "completed"]
    assert len(list((tmp_path / "multirun").rglob("sweep.yaml"))) == 1  # no second sweep directory


@pytest.mark.slow
def test_optuna_records_a_failed_trial_and_goes_on(tmp_path):
    recipe = tmp_path / "search.yaml"
    recipe.write_text(textwrap.dedent("""\
        defaults:
          - digits_classifier
          - override hparams_search: digits_optuna
          - _self_
        trainer:
          max_steps: 5
          val_every: 5
          progress_bar: false
        hydra:
          sweeper:
            n_trials: 6
            params:
              model.dropout: choice(0.1, 1.5)
        """))
    result = framework_cmd("run", str(recipe), "-m", "name=opt", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = summary_rows(tmp_path / "multirun" / "opt")
    assert len(rows) == 6
    for row in rows:
        assert row["status"] == ("failed" if "model.dropout=1.5" in row["overrides"] else "completed"), row
    assert {r["status"] for r in rows} == {"failed", "completed"}
    completed = [float(r["value"]) for r in rows if r["status"] == "completed"]
    assert completed == sorted(completed, reverse=True)  # val/accuracy: higher first
    results = (tmp_path / "multirun" / "opt" / "optimization_results.yaml").read_text()
    assert f"best_value: {max(completed)}" in results


def test_a_swept_value_is_told_from_a_single_value():
    from framework.sweep_record import _is_swept

    assert _is_swept("1e-3,3e-3") and _is_swept("range(1,4)") and _is_swept("choice(a,b)")
    assert not _is_swept("[csv,tensorboard]") and not _is_swept("0.1") and not _is_swept("{a:1,b:2}")
