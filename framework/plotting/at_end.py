"""The figures every run and sweep writes when it ends (`trainer.plot`), if matplotlib is there.
A figure is a convenience: drawing it never fails the run that made the numbers."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from framework.console import warn
from framework.errors import UserError
from framework.plotting.figures import runs_figure, write_sweep_figures
from framework.plotting.run_data import read_run, read_sweep


def can_plot() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def run_figures(run_dir: Path) -> list[Path]:
    """`<run dir>/metrics.png`; nothing when matplotlib is missing or the run logged no CSV."""
    if not can_plot() or not (Path(run_dir) / "metrics.csv").is_file():
        return []
    return _drawn(lambda: [runs_figure([read_run(run_dir)], Path(run_dir) / "metrics.png")])


def sweep_figures(sweep_dir: Path) -> list[Path]:
    """`<sweep dir>/sweep.png` (objective against each swept value) and `curves.png` (every job)."""
    if not can_plot():
        return []
    return _drawn(lambda: write_sweep_figures(read_sweep(sweep_dir)))


def _drawn(draw) -> list[Path]:
    try:
        return draw()
    except UserError:  # nothing to draw (no metric a figure shows)
        return []
    except Exception as err:  # a plotting bug must not turn a finished run into a failed one
        warn(f"the figure was not drawn ({type(err).__name__}: {err}); `framework plot` draws it later.")
        return []
