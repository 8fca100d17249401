"""`logger=csv`: metrics.csv (one row per logged step, one column per metric) and hparams.yaml."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from framework.loggers.base import Logger


class CSVLogger(Logger):
    """Appends rows to `<run dir>/<filename>`; when a new metric appears the file is rewritten
    with the wider header (rare: only the first time each metric is logged)."""

    def __init__(self, save_dir: str, filename: str = "metrics.csv"):
        """filename: the CSV file inside the run directory."""
        super().__init__(save_dir)
        self.path = Path(save_dir) / filename
        self.columns: list[str] = ["step"]
        self.rows: list[dict[str, Any]] = []
        if self.path.exists():  # a resumed run in the same directory continues the file
            with open(self.path, newline="") as f:
                reader = csv.DictReader(f)
                self.columns = list(reader.fieldnames or ["step"])
                self.rows = list(reader)

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(OmegaConf.create(params), self.path.with_name("hparams.yaml"))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        row = {"step": step, **metrics}
        self.rows.append(row)
        new = [k for k in row if k not in self.columns]
        if new:
            self.columns += new
            self._rewrite()
            return
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.columns).writerow(row)

    def truncate(self, step: int) -> None:
        kept = [r for r in self.rows if int(r["step"]) <= step]
        if len(kept) != len(self.rows):
            self.rows = kept
            self._rewrite()

    def _rewrite(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns)
            writer.writeheader()
            writer.writerows(self.rows)
        tmp.replace(self.path)
