"""summary.json: what a run ended as, built in one place for every way it ends (completed,
diverged, failed in a sweep) and for what a later command adds (`framework test`'s scores).

Its fields: name, status, objective and objective_value (what sweepers optimise), the overrides
the run was started with, wall_time_s; a completed run adds its final metrics, strategy,
precision, world size and output directory, a diverged one what diverged, a failed one its error,
a tested one its test record. The sweep's table (framework/sweeps.py) and the plots read them.
"""
from __future__ import annotations

import json
from pathlib import Path

from framework.results import write_json
from framework.sweep_record import SUMMARY_FILE


def run_summary(name: str, status: str, objective: str | None, objective_value, overrides: list[str],
                wall_time_s: float, **fields) -> dict:
    """A run's summary: the fields every summary has, then what its ending adds (`fields`)."""
    return {"name": name, "status": status, "objective": objective, "objective_value": objective_value,
            "overrides": list(overrides), "wall_time_s": round(wall_time_s, 3), **fields}


def write_summary(output_dir: Path, summary: dict) -> Path:
    return write_json(Path(output_dir) / SUMMARY_FILE, summary)


def add_to_summary(output_dir: Path, **fields) -> Path:
    """The run's summary with `fields` added (a later command's results); an unreadable summary is
    replaced, not trusted."""
    path = Path(output_dir) / SUMMARY_FILE
    try:
        summary = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        summary = {}
    return write_summary(output_dir, {**summary, **fields})
