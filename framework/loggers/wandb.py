"""`logger=wandb`: Weights & Biases, offline by default (lazy import).

Offline (the default: nothing may reach the network during a run), the run is written under
`<run dir>/wandb/offline-run-*/`; `wandb sync <run dir>/wandb/offline-run-*` uploads it later.
`logger.wandb.mode=online` logs live (after `wandb login`). The resolved config is the run's
config (hyper-parameters), every metric is logged at its step (the test scores of an earlier
checkpoint, which W&B cannot add below its latest step, against `test/step`), and the test metrics
(`trainer.test_at_end`) are in the run's summary. A resumed run continues its W&B run (the id is
kept in the run directory); a sweep's jobs share a group named after the sweep.
"""
from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any, Literal

from framework.loggers.base import Logger
from framework.sweep_record import job_label

RUN_ID_FILE = "wandb_run_id"
SUMMARY_PREFIXES = ("test/",)  # written to the run's summary too: the scores a run is compared by


class WandbLogger(Logger):
    requires_packages = {"wandb": "'framework[wandb]'"}

    def __init__(self, save_dir: str, project: str = "framework", name: str | None = None, entity: str | None = None,
                 group: str | None = None, tags: list[str] | None = None,
                 mode: Literal["offline", "online", "disabled"] = "offline"):
        """project: the W&B project; name: the run's name (null: the run directory's, or a sweep
        job's swept values); entity: the team or user (null: the default); group: runs shown
        together (null: a sweep's name for its jobs); tags: labels; mode: offline (written to
        the run directory, `wandb sync` uploads it later), online or disabled."""
        super().__init__(save_dir)
        import wandb

        directory = Path(save_dir)
        id_file = directory / RUN_ID_FILE
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(6)  # [0-9a-f]: a valid W&B id
        label = job_label(directory)
        settings = wandb.Settings(silent=True, console="off", disable_git=True, save_code=False, x_disable_stats=True)
        self.run = wandb.init(project=project, entity=entity, name=name or label or directory.name,
                              group=group or (directory.parent.name if label else None), tags=list(tags or []),
                              dir=str(directory), mode=mode, id=run_id, resume="allow", settings=settings,
                              reinit="create_new")
        directory.mkdir(parents=True, exist_ok=True)
        id_file.write_text(run_id)
        self._latest_step = -1

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        self.run.config.update(params, allow_val_change=True)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        values = {k: float(v) for k, v in metrics.items()}
        if step < self._latest_step:  # W&B drops a step below its latest: plotted against <prefix>/step instead
            for prefix in {k.split("/", 1)[0] for k in values if "/" in k}:
                self.run.define_metric(f"{prefix}/*", step_metric=f"{prefix}/step")
                values[f"{prefix}/step"] = float(step)
            self.run.log(values)
        else:
            self._latest_step = step
            self.run.log(values, step=step)
        for key, value in metrics.items():
            if key.startswith(SUMMARY_PREFIXES):
                self.run.summary[key] = float(value)

    def finalize(self) -> None:
        self.run.finish()
