"""logger=mlflow: a local SQLite store, parameters once, metrics from rank zero only."""
from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from framework.loggers.mlflow import MLflowLogger, close_sweep_run, flatten, open_sweep_run
from tests.conftest import TINY_GPT
from tests.helpers.in_process import run_command


def client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def test_flatten_makes_dotted_string_params():
    assert flatten({"model": {"n_layer": 2, "act": None}, "lr": 0.1, "tags": [1, 2]}) == {
        "model.n_layer": "2", "model.act": "None", "lr": "0.1", "tags": "[1, 2]"}


def test_metrics_and_params_and_a_resumed_run_continue_one_mlflow_run(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    log = MLflowLogger(str(run_dir), tracking_uri=uri, experiment="exp")
    log.log_hyperparams({"model": {"n_layer": 2}, "seed": 1})
    log.log_metrics({"train/loss": 2.0}, 1)
    log.log_metrics({"train/loss": 1.5, "val/loss": 1.7}, 2)
    log.finalize()
    again = MLflowLogger(str(run_dir), tracking_uri=uri, experiment="exp")  # resumed in the same directory
    assert again.run_id == log.run_id
    again.log_hyperparams({"model": {"n_layer": 2}, "seed": 1})  # already there: not logged twice
    again.log_metrics({"train/loss": 1.0}, 3)
    again.finalize()
    c = client(uri)
    run = c.get_run(log.run_id)
    assert run.data.params == {"model.n_layer": "2", "seed": "1"} and run.info.status == "FINISHED"
    assert [(m.step, m.value) for m in c.get_metric_history(log.run_id, "train/loss")] == [(1, 2.0), (2, 1.5), (3, 1.0)]
    assert run.info.run_name == "run"
    assert len(c.search_runs([c.get_experiment_by_name("exp").experiment_id])) == 1


@pytest.mark.slow  # a fresh interpreter or a pool of processes (make test-fast starts none)
def test_mlflow_is_imported_only_when_chosen():
    code = "import sys, framework.loggers.mlflow, framework.runner; print('mlflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


@pytest.mark.slow
def test_two_processes_log_one_run_from_rank_zero(tmp_path):
    result = run_command(["train", "name=ml", "strategy=ddp", "devices=2", "logger=[csv,mlflow]", "trainer.max_steps=4",
                          "trainer.val_every=2", *TINY_GPT, "trainer.log_every=1"], tmp_path)  # in this process
    assert result.returncode == 0, result.stderr[-3000:]
    c = client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = c.search_runs([c.get_experiment_by_name("framework").experiment_id])
    assert run.info.run_name == "ml" and run.data.params["strategy._target_"] == "framework.strategy.ddp.DDPStrategy"
    assert run.data.params["devices"] == "2"
    history = [(m.step, m.value) for m in c.get_metric_history(run.info.run_id, "train/loss")]
    with open(tmp_path / "outputs" / "ml" / "metrics.csv") as f:
        from_csv = [(int(r["step"]), float(r["train/loss"])) for r in csv.DictReader(f) if r["train/loss"]]
    assert history == from_csv and len(history) == 4  # one value per step: rank zero only


def test_sweep_jobs_are_named_by_their_swept_values_and_tagged_with_their_sweep(tmp_path):
    from omegaconf import OmegaConf

    sweep = tmp_path / "multirun" / "lr_sweep"
    sweep.mkdir(parents=True)
    OmegaConf.save(OmegaConf.create({"config_name": "train", "overrides": [
        "name=lr_sweep", "optimizer.lr=1e-3,3e-3", "logger=[csv,mlflow]", "trainer.max_steps=4"]}), sweep / "sweep.yaml")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = open_sweep_run({"tracking_uri": uri, "experiment": "framework"}, sweep)
    for job, lr in enumerate(("1e-3", "3e-3")):
        (sweep / str(job) / ".hydra").mkdir(parents=True)
        OmegaConf.save(OmegaConf.create(["name=lr_sweep", f"optimizer.lr={lr}", "logger=[csv,mlflow]",
                                         "trainer.max_steps=4"]), sweep / str(job) / ".hydra" / "overrides.yaml")
        MLflowLogger(str(sweep / str(job)), tracking_uri=uri).finalize()
    c = client(uri)
    runs = c.search_runs([c.get_experiment_by_name("framework").experiment_id], "tags.sweep = 'lr_sweep'")
    jobs = sorted((r.info.run_name, r.data.tags.get("sweep_job"), r.data.tags.get("mlflow.parentRunId"))
                  for r in runs if r.info.run_id != parent)
    assert jobs == [("0 optimizer.lr=1e-3", "0", parent), ("1 optimizer.lr=3e-3", "1", parent)]
    close_sweep_run({"tracking_uri": uri}, sweep, {"objective": "val/loss", "value": 1.25, "job": 1})
    sweep_run = c.get_run(parent)
    assert sweep_run.info.run_name == "lr_sweep" and sweep_run.info.status == "FINISHED"
    assert sweep_run.data.metrics == {"val/loss": 1.25} and sweep_run.data.tags["best_job"] == "1"
    assert open_sweep_run({"tracking_uri": uri}, sweep) == parent  # re-run with resume=auto: the same run
