"""What a figure shows, read back from run and sweep directories (metrics.csv, summary.json,
.hydra/overrides.yaml, sweep.yaml): plain Python, no matplotlib."""
from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from framework.config.overrides import defining_overrides
from framework.errors import UserError
from framework.sweep_record import SUMMARY_FILE, SWEEP_RECORD_FILE, SWEEP_SUMMARY_FILE

METRICS_FILE = "metrics.csv"


@dataclass
class Run:
    """One run: its series (metric -> [(step, value)]), its overrides and its summary."""

    path: Path
    series: dict[str, list[tuple[int, float]]]
    overrides: list[str] = field(default_factory=list)
    summary: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.summary.get("name") or self.path.name


@dataclass
class Sweep:
    """A sweep directory: its jobs (completed or not), the objective and which way is better."""

    path: Path
    jobs: list[Run]
    objective: str
    mode: str  # "min" or "max"

    def swept_values(self) -> dict[str, list[str]]:
        """key -> each job's value, for the keys whose value differs between jobs."""
        per_job = [dict(o.split("=", 1) for o in job.overrides if "=" in o) for job in self.jobs]
        keys = sorted({k for values in per_job for k in values})
        swept = {k: [values.get(k, "") for values in per_job] for k in keys}
        return {k: v for k, v in swept.items() if len(set(v)) > 1}

    def best(self) -> Run | None:
        scored = [job for job in self.jobs if _finite(job.summary.get("objective_value"))]
        if not scored:
            return None
        pick = min if self.mode == "min" else max
        return pick(scored, key=lambda job: float(job.summary["objective_value"]))


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def read_series(path: Path) -> dict[str, list[tuple[int, float]]]:
    """metrics.csv -> {metric: [(step, value), ...]} (empty cells and non-numbers left out)."""
    series: dict[str, list[tuple[int, float]]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            step = int(float(row["step"]))
            for key, text in row.items():
                if key == "step" or text in (None, ""):
                    continue
                try:
                    series.setdefault(key, []).append((step, float(text)))
                except ValueError:
                    continue
    return series


def read_run(path: Path) -> Run:
    path = Path(path)
    metrics = path / METRICS_FILE
    if not metrics.is_file():
        raise UserError(f"{path} is not a run directory: it has no {METRICS_FILE} (a run with logger=csv writes one; "
                        "a sweep's directory holds one run directory per job).")
    summary = _read_json(path / SUMMARY_FILE)
    overrides = summary.get("overrides")
    if not overrides and (path / ".hydra" / "overrides.yaml").is_file():
        overrides = list(OmegaConf.load(path / ".hydra" / "overrides.yaml"))
    return Run(path, read_series(metrics), defining_overrides(overrides or []), summary)


def is_sweep(path: Path) -> bool:
    path = Path(path)
    return (path / SWEEP_RECORD_FILE).is_file() or (path / SWEEP_SUMMARY_FILE).is_file() or (
        not (path / METRICS_FILE).is_file() and any(_job_dirs(path)))


def read_sweep(path: Path) -> Sweep:
    path = Path(path)
    jobs = [read_run(job) for job in _job_dirs(path) if (job / METRICS_FILE).is_file()]
    if not jobs:
        raise UserError(f"{path} holds no finished sweep job: none of its numbered folders has a {METRICS_FILE}.")
    objective = next((j.summary["objective"] for j in jobs if j.summary.get("objective")), "val/loss")
    mode = "min"
    config = path / "0" / "config.yaml"
    if config.is_file():
        mode = str(OmegaConf.load(config).get("trainer", {}).get("objective_mode", "min"))
    return Sweep(path, jobs, objective, mode)


def _job_dirs(path: Path) -> list[Path]:
    if not path.is_dir():
        return []
    return sorted((p for p in path.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def differing_overrides(runs: list[Run]) -> list[str]:
    """A label per run: the overrides not shared by every run (all of them for a single run)."""
    if len(runs) == 1:
        return [" ".join(runs[0].overrides) or runs[0].name]
    common = set.intersection(*(set(r.overrides) for r in runs))
    labels = [" ".join(o for o in r.overrides if o not in common) for r in runs]
    return [label or run.name for label, run in zip(labels, runs)]
