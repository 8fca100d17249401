"""Sweeps (`-m`): a failed job is recorded, not fatal; finished jobs are skipped on a re-run with
resume=auto; at the end the launching process writes `sweep_summary.csv` and prints a table.

Every job writes `summary.json` in its directory (status completed or failed, the objective, its
overrides, wall time). `SweepSummaryCallback` (a Hydra callback, registered in conf/train.yaml)
reads them all when the sweep ends, so it works the same for the basic launcher, Optuna and
submitit (whose jobs run elsewhere and report through the shared directory).
"""
from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import OmegaConf

from framework.config.overrides import defining_overrides
from framework.errors import ExitCode, RunExit
from framework.loggers.mlflow import close_sweep_run, open_sweep_run
from framework.plotting.at_end import sweep_figures
from framework.sweep_record import SUMMARY_FILE, SWEEP_RECORD_FILE, SWEEP_SUMMARY_FILE


@dataclass
class SweepJob:
    num: int
    overrides: list[str]
    sweep_dir: Path


def current_job() -> SweepJob | None:
    """This job's place in the sweep, or None outside `-m`."""
    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return None
    return SweepJob(int(hydra_cfg.job.num), list(hydra_cfg.overrides.task), Path(hydra_cfg.sweep.dir))


def run_overrides() -> list[str]:
    """The overrides this run was started with (a sweep job's or a single run's), as Hydra recorded
    them; [] when the config did not come through Hydra's command line (e.g. the compose API)."""
    if not HydraConfig.initialized():
        return []
    return list(HydraConfig.get().overrides.task)


def finished_objective(output_dir: Path, job: SweepJob) -> tuple[bool, Any]:
    """(True, objective) when this job already completed with the same overrides."""
    path = Path(output_dir) / SUMMARY_FILE
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return False, None
    same = defining_overrides(summary.get("overrides", [])) == defining_overrides(job.overrides)
    if summary.get("status") == "completed" and same:
        return True, summary.get("objective_value")
    return False, None


def read_jobs(sweep_dir: Path) -> list[dict]:
    """One row per job directory (a folder named by its job number) of the sweep."""
    rows = []
    for job_dir in sorted((p for p in Path(sweep_dir).iterdir() if p.is_dir() and p.name.isdigit()),
                          key=lambda p: int(p.name)):
        row = {"job": int(job_dir.name), "overrides": "", "objective": "", "value": None, "status": "missing",
               "wall_time_s": None, "error": "", "output_dir": str(job_dir)}
        try:
            summary = json.loads((job_dir / SUMMARY_FILE).read_text())
        except (OSError, ValueError):
            overrides_file = job_dir / ".hydra" / "overrides.yaml"
            if overrides_file.is_file():
                row["overrides"] = " ".join(OmegaConf.load(overrides_file))
            row["error"] = "no summary.json: the job did not finish (killed, or still running)"
            rows.append(row)
            continue
        value = summary.get("objective_value")
        row.update(overrides=" ".join(defining_overrides(summary.get("overrides", []))),
                   objective=summary.get("objective", ""), status=summary.get("status", "completed"),
                   value=value if isinstance(value, (int, float)) and not math.isnan(value) else None,
                   wall_time_s=summary.get("wall_time_s"), error=summary.get("error", ""))
        rows.append(row)
    return rows


def rank_rows(rows: list[dict], mode: str) -> list[dict]:
    """Best first: completed jobs by value (min or max), then jobs without a value."""
    scored = [r for r in rows if r["value"] is not None]
    scored.sort(key=lambda r: r["value"], reverse=(mode == "max"))
    return scored + [r for r in rows if r["value"] is None]


def write_sweep_summary(sweep_dir: Path, mode: str = "min", stream=None) -> list[dict]:
    stream = stream or sys.stdout
    rows = rank_rows(read_jobs(sweep_dir), mode)
    columns = ["rank", "job", "overrides", "objective", "value", "status", "wall_time_s", "error", "output_dir"]
    tmp = Path(sweep_dir) / (SWEEP_SUMMARY_FILE + ".tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for rank, row in enumerate(rows, 1):
            writer.writerow({"rank": rank, **{k: ("" if row[k] is None else row[k]) for k in columns[1:]}})
    tmp.replace(Path(sweep_dir) / SWEEP_SUMMARY_FILE)
    print_table(rows, mode, stream)
    print(f"sweep summary: {Path(sweep_dir) / SWEEP_SUMMARY_FILE}", file=stream)
    return rows


def print_table(rows: list[dict], mode: str, stream) -> None:
    """The ranked jobs; overrides every job shares are printed once above the table."""
    objective = next((r["objective"] for r in rows if r["objective"]), "objective")
    split = [r["overrides"].split() for r in rows]
    common = [o for o in (split[0] if split else []) if all(o in s for s in split)] if len(rows) > 1 else []
    if common:
        print(f"every job: {' '.join(common)}", file=stream)
    header = ["#", "job", "overrides", f"{objective} ({mode})", "status", "time s"]
    body = [[str(i), str(r["job"]), " ".join(o for o in s if o not in common) or "(none)",
             "" if r["value"] is None else f"{r['value']:.6g}", r["status"],
             "" if r["wall_time_s"] is None else f"{float(r['wall_time_s']):.1f}"]
            for i, (r, s) in enumerate(zip(rows, split), 1)]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    for line in [header, *body]:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip(), file=stream)
    failed = [r for r in rows if r["status"] != "completed"]
    for r in failed:
        print(f"job {r['job']} {r['status']}: {r['error']}", file=stream)


def _mlflow_settings(config) -> dict | None:
    """The sweep's MLflow logger settings when its jobs log to MLflow (logger=[...,mlflow])."""
    node = (config.get("logger") or {}).get("mlflow")
    if node is None or not str(node.get("_target_", "")).endswith("MLflowLogger"):
        return None
    return {"tracking_uri": node.get("tracking_uri"), "experiment": node.get("experiment", "framework")}


class SweepSummaryCallback(Callback):
    """Hydra callback: records the sweep's command when it starts (`sweep.yaml`: recipe and
    overrides, how a re-run with resume=auto finds it), and writes the summary after the last job
    (launching process only)."""

    def on_multirun_start(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        overrides = [*config.hydra.overrides.task, *config.hydra.overrides.hydra]
        record = {"config_name": config.hydra.job.config_name, "overrides": overrides}
        OmegaConf.save(OmegaConf.create(record), sweep_dir / SWEEP_RECORD_FILE)
        mlflow = _mlflow_settings(config)
        if mlflow is not None:
            open_sweep_run(mlflow, sweep_dir)

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        mode = str(config.get("trainer", {}).get("objective_mode", "min"))
        rows = write_sweep_summary(sweep_dir, mode)
        mlflow = _mlflow_settings(config)
        if mlflow is not None:
            close_sweep_run(mlflow, sweep_dir, next((r for r in rows if r["status"] == "completed"), None))
        if config.get("trainer", {}).get("plot", True):
            for figure in sweep_figures(sweep_dir):
                print(f"figure: {figure}", flush=True)
        if rows and all(r["status"] != "completed" for r in rows):
            print("every job of the sweep failed", file=sys.stderr)
            raise RunExit(ExitCode.FAILED)
