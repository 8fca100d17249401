"""`logger=csv`: metrics.csv (one row per step, one column per metric) and hparams.yaml."""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from framework.loggers.base import Logger


class CSVLogger(Logger):
    """`<run dir>/<filename>`: one row per step, one column per metric, ready for
    `pandas.read_csv` as it is. Metrics logged at the same step (training, validation, learning
    rate, checkpoint timing) share that step's row; a metric not logged at a step is an empty
    cell. Columns: `step`, then each metric in the order it first appeared. Metrics of an earlier
step (a checkpoint's test scores, logged after training) join that step's row. A row is written as
    soon as it is logged (its step's later metrics rewrite that last line only); a new metric
    rewrites the file once with the wider header."""

    def __init__(self, save_dir: str, filename: str = "metrics.csv"):
        """filename: the CSV file inside the run directory."""
        super().__init__(save_dir)
        self.path = Path(save_dir) / filename
        self.columns: list[str] = ["step"]
        self.rows: list[dict[str, Any]] = []
        self._last_row_at: int | None = None  # byte offset where the last row starts in the file
        self._file = None  # opened once and kept open between rows, not opened and closed for each
        if self.path.exists():  # a resumed run in the same directory continues the file
            with open(self.path, newline="") as f:
                reader = csv.DictReader(f)
                self.columns = list(reader.fieldnames or ["step"])
                self.rows = list(reader)

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(OmegaConf.create(params), self.path.with_name("hparams.yaml"))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self.rows and step < int(self.rows[-1]["step"]):  # an earlier step (a checkpoint's test scores)
            self._merge_earlier(metrics, step)
            return
        same_step = bool(self.rows) and int(self.rows[-1]["step"]) == step
        if same_step:
            self.rows[-1].update(metrics)
        else:
            self.rows.append({"step": step, **metrics})
        new = [k for k in metrics if k not in self.columns]
        if new or (same_step and self._last_row_at is None):
            self.columns += new
            self._rewrite()
            return
        if self._file is None:
            self._file = open(self.path, "r+b")
        f = self._file
        if same_step:
            f.seek(self._last_row_at)
            f.truncate()
        else:
            f.seek(0, io.SEEK_END)
        self._last_row_at = f.tell()
        f.write(self._line(self.rows[-1]))
        f.flush()  # in the file for a reader (and a crash) at once

    def _merge_earlier(self, metrics: dict[str, float], step: int) -> None:
        """Into that step's row (a new row in step order where there is none); the file rewritten."""
        row = next((r for r in self.rows if int(r["step"]) == step), None)
        if row is None:
            at = next(i for i, r in enumerate(self.rows) if int(r["step"]) > step)
            self.rows.insert(at, {"step": step})
            row = self.rows[at]
        row.update(metrics)
        self.columns += [k for k in metrics if k not in self.columns]
        self._rewrite()

    def truncate(self, step: int) -> None:
        kept = [r for r in self.rows if int(r["step"]) <= step]
        if len(kept) != len(self.rows):
            self.rows = kept
            self._rewrite()

    def _line(self, row: dict[str, Any]) -> bytes:
        text = io.StringIO()
        csv.DictWriter(text, fieldnames=self.columns).writerow(row)
        return text.getvalue().encode()

    def finalize(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _rewrite(self) -> None:
        self.finalize()  # the file is replaced: the next row opens the new one
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            text = io.StringIO()
            csv.DictWriter(text, fieldnames=self.columns).writeheader()
            f.write(text.getvalue().encode())
            for row in self.rows:
                self._last_row_at = f.tell()
                f.write(self._line(row))
        if not self.rows:
            self._last_row_at = None
        tmp.replace(self.path)
