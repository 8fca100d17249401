"""`logger=tensorboard`: TensorBoard event files (lazy import).

A single run writes to `<run dir>/<subdir>`. A sweep's jobs all write under the sweep's own
`<sweep dir>/<subdir>/`, one folder per job named by its number and swept values, so
`tensorboard --logdir <sweep dir>/<subdir>` lists the jobs by what differs between them. Every
run also writes its hyper-parameters for the HParams dashboard, with the run's objective
(`trainer.objective`) as the metric the jobs are sorted by.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from framework.errors import ConfigError
from framework.loggers.base import Logger
from framework.sweep_record import job_label

HPARAM_TYPES = (bool, int, float, str)


def hparam_values(params: dict[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """{'model': {'n_layer': 2}} -> {'model.n_layer': 2}: the types the HParams dashboard takes
    (numbers, strings, booleans); null and lists written as text."""
    flat: dict[str, bool | int | float | str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(hparam_values(value, f"{name}."))
        elif isinstance(value, HPARAM_TYPES) and not (isinstance(value, float) and not math.isfinite(value)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat


class TensorBoardLogger(Logger):
    """Scalars per step; hyper-parameters for the HParams dashboard and, as text, the resolved config."""

    requires_packages = {"tensorboard": "'framework[tensorboard]'"}

    def __init__(self, save_dir: str, subdir: str = "tensorboard", flush_secs: int = 30):
        """subdir: folder inside the run directory (a sweep: inside the sweep's directory, one
        folder per job); flush_secs: how often events reach disk."""
        super().__init__(save_dir)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise ConfigError("logger=tensorboard needs the tensorboard package: "
                              "pip install 'framework[tensorboard]' (or drop it from logger=[...]).") from err
        label = job_label(Path(save_dir))
        if label is None:
            self.log_dir = Path(save_dir) / subdir
        else:  # a folder name: no path separators
            self.log_dir = Path(save_dir).parent / subdir / label.replace("/", "_")
        self.writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=flush_secs)

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        text = OmegaConf.to_yaml(OmegaConf.create(params))
        self.writer.add_text("hparams", "```\n" + text + "\n```", 0)
        objective = str(params.get("trainer", {}).get("objective", "val/loss"))
        # The dashboard reads each metric's value from the scalars logged under the same tag in
        # this folder; the value given here is only a placeholder for its schema.
        experiment, start, end = hparams(hparam_values(params), {objective: 0.0})
        writer = self.writer._get_file_writer()
        for summary in (experiment, start, end):
            writer.add_summary(summary)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)

    def finalize(self) -> None:
        self.writer.flush()
        self.writer.close()
