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
from framework.sweeps import job_label

RUN_ID_FILE = "mlflow_run_id"
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
    sweep's jobs are named by their swept values and tagged `sweep` (the sweep's name) and
    `sweep_job`, so the MLflow UI can filter (`tags.sweep = "..."`) and group them; the objective is
    the metric of the same name."""

    requires_packages = {"mlflow": "'framework[mlflow]'"}

    def __init__(self, save_dir: str, tracking_uri: str | None = None, experiment: str = "framework",
                 run_name: str | None = None):
        """tracking_uri: the MLflow store (e.g. sqlite:///path/mlflow.db, http://server:5000); null:
        sqlite:///mlflow.db in the directory the run was started from; experiment: the MLflow
        experiment runs are grouped under; run_name: null for the run directory's name."""
        super().__init__(save_dir)
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri or f"sqlite:///{Path.cwd() / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        id_file = Path(save_dir) / RUN_ID_FILE
        if id_file.is_file():  # a resumed run continues its MLflow run
            self.run_id = id_file.read_text().strip()
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            label = job_label(Path(save_dir))  # a sweep job: named by its swept values, tagged by its sweep
            tags = {"sweep": Path(save_dir).parent.name, "sweep_job": Path(save_dir).name} if label else {}
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
