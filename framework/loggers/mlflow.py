"""`logger=mlflow`: parameters and metrics in an MLflow tracking store (lazy import).

The default store is a SQLite file, `mlflow.db`, in the directory the run was started from: no
server, and every run started there lands in the same store (`mlflow ui --backend-store-uri
sqlite:///mlflow.db` shows them side by side). A resumed run continues its MLflow run: the run id
is kept in the run directory.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from framework.loggers.base import Logger
from framework.sweep_record import job_label

RUN_ID_FILE = "mlflow_run_id"
PARENT_RUN_ID_FILE = "mlflow_parent_run_id"  # in a sweep's directory: the run its jobs nest under
MAX_PARAM_LENGTH = 500  # the limit older tracking servers enforce
BATCH = 100  # MLflow's limit of parameters per log_batch call


def flatten(params: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """{'model': {'n_layer': 2}} -> {'model.n_layer': '2'}; lists are written whole."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)[:MAX_PARAM_LENGTH]
    return flat


class MLflowLogger(Logger):
    """One MLflow run per training run; the resolved config as flat parameters, logged once. A
    sweep has a run of its own (made when it starts, holding the best job's objective when it
    ends) and its jobs' runs nest under it, named by their swept values and tagged `sweep` and
    `sweep_job`; the objective is the metric of the same name."""

    requires_packages = {"mlflow": "'framework[mlflow]'"}

    def __init__(self, save_dir: str, tracking_uri: str | None = None, experiment: str = "framework",
                 run_name: str | None = None):
        """tracking_uri: the MLflow store (e.g. sqlite:///path/mlflow.db, http://server:5000); null:
        sqlite:///mlflow.db in the directory the run was started from; experiment: the MLflow
        experiment runs are grouped under; run_name: null for the run directory's name."""
        super().__init__(save_dir)
        self.tracking_uri, self.client, experiment_id = _open(tracking_uri, experiment)
        id_file = Path(save_dir) / RUN_ID_FILE
        if id_file.is_file():  # a resumed run continues its MLflow run
            self.run_id = id_file.read_text().strip()
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            label = job_label(Path(save_dir))  # a sweep job: named by its swept values, tagged by its sweep
            tags = {"sweep": Path(save_dir).parent.name, "sweep_job": Path(save_dir).name} if label else {}
            parent = Path(save_dir).parent / PARENT_RUN_ID_FILE
            if label and parent.is_file():  # nested under the sweep's own run in the MLflow UI
                tags["mlflow.parentRunId"] = parent.read_text().strip()
            run = self.client.create_run(experiment_id, run_name=run_name or label or Path(save_dir).name, tags=tags)
            self.run_id = run.info.run_id
            id_file.parent.mkdir(parents=True, exist_ok=True)
            id_file.write_text(self.run_id)
        self._params_logged = bool(self.client.get_run(self.run_id).data.params)

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        if self._params_logged:  # MLflow parameters are immutable; a resumed run has them already
            return
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in flatten(params).items()]
        for start in range(0, len(items), BATCH):
            self.client.log_batch(self.run_id, params=items[start:start + BATCH])
        self._params_logged = True

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def finalize(self) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED")


def _open(tracking_uri: str | None, experiment: str):
    """(tracking URI, client, experiment id): the store, and the experiment made if missing."""
    from mlflow.tracking import MlflowClient

    uri = tracking_uri or f"sqlite:///{Path.cwd() / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    return uri, client, found.experiment_id if found else client.create_experiment(experiment)


def open_sweep_run(settings: dict, sweep_dir: Path) -> str:
    """The sweep's own MLflow run, which its jobs' runs nest under (made by the launching process
    when the sweep starts; `settings`: the logger's config, for its store and experiment)."""
    _, client, experiment_id = _open(settings.get("tracking_uri"), settings.get("experiment", "framework"))
    id_file = Path(sweep_dir, PARENT_RUN_ID_FILE)
    if id_file.is_file():  # the sweep run again with resume=auto: its jobs' runs are under this one
        run_id = id_file.read_text().strip()
        client.update_run(run_id, status="RUNNING")
        return run_id
    run = client.create_run(experiment_id, run_name=Path(sweep_dir).name, tags={"sweep": Path(sweep_dir).name})
    id_file.write_text(run.info.run_id)
    return run.info.run_id


def close_sweep_run(settings: dict, sweep_dir: Path, best: dict | None) -> None:
    """When the sweep ends: the best job's objective on the sweep's run, and the run finished."""
    id_file = Path(sweep_dir, PARENT_RUN_ID_FILE)
    if not id_file.is_file():
        return
    _, client, _ = _open(settings.get("tracking_uri"), settings.get("experiment", "framework"))
    run_id = id_file.read_text().strip()
    if best is not None and best.get("value") is not None:
        client.log_metric(run_id, str(best["objective"]), float(best["value"]))
        client.set_tag(run_id, "best_job", str(best["job"]))
    client.set_terminated(run_id, status="FINISHED")
