"""How a run leaves the process when it fails: each kind of failure's exit code and the one
paragraph it prints, and what a refused run leaves behind (nothing). Fit, test and predict all
leave this way (framework/modes.py, framework/runner.py); a sweep's job records its failure
instead and lets the sweep go on (framework/sweep_job.py)."""
from __future__ import annotations

import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

from hydra.core.hydra_config import HydraConfig

from framework.errors import ExitCode, RunExit, StorageError, UserError, heading, report, wants_traceback
from framework.launch.elastic import WorkerFailed
from framework.loop.nonfinite import Diverged
from framework.loop.preemption import Preempted

# How each way a run can fail leaves the process (framework/errors.py documents the codes).
EXIT_CODES = {StorageError: ExitCode.STORAGE, UserError: ExitCode.USER_ERROR, WorkerFailed: ExitCode.FAILED,
              Preempted: ExitCode.PREEMPTED, Diverged: ExitCode.DIVERGED}


def exit_code(err: BaseException) -> ExitCode:
    return next(code for kind, code in EXIT_CODES.items() if isinstance(err, kind))


def describe(err: BaseException) -> str:
    """The failure as the user reads it (the first line is what a sweep's summary records)."""
    if isinstance(err, Preempted):
        return f"preempted: {err}"
    if isinstance(err, Diverged):
        return f"diverged: {err}"
    return f"{heading(err)}: {err}"


def say_failure(err: BaseException) -> None:
    print(describe(err), file=sys.stderr, flush=True)


@contextmanager
def leave_on_failure(debug: bool, output_dir: Path | None = None):
    """Inside: a user error is reported as one paragraph (a traceback only with debug=true or
    HYDRA_FULL_ERROR=1) and the directory Hydra made for a refused run is removed; a failed
    worker, a preemption or a divergence is said; each leaves with its exit code (RunExit)."""
    try:
        yield
    except UserError as err:
        remove_fresh_hydra_dir(output_dir)
        if wants_traceback(debug):
            raise
        report(err)
        raise RunExit(exit_code(err)) from None
    except (WorkerFailed, Preempted, Diverged) as err:
        say_failure(err)
        raise RunExit(exit_code(err)) from None


def hydra_output_dir(name: str) -> Path:
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path("outputs") / name


def remove_fresh_hydra_dir(output_dir) -> None:
    """A run refused before it started leaves nothing behind: remove the directory Hydra made
    for it if it holds only Hydra's own records (never a directory with results in it)."""
    if output_dir is not None or not HydraConfig.initialized():
        return
    path = Path(HydraConfig.get().runtime.output_dir)
    try:  # processes a scheduler started together may all be refused, and remove it at once
        if path.is_dir() and all(p.name in (".hydra", "train.log") or p.suffix == ".log" for p in path.iterdir()):
            if all(f.stat().st_size == 0 for f in path.glob("*.log")):
                shutil.rmtree(path, ignore_errors=True)
                cwd = Path.cwd().resolve()
                for parent in path.resolve().parents:  # and the empty folders above it (outputs/<date>/)
                    if parent == cwd or cwd not in parent.parents or any(parent.iterdir()):
                        break
                    parent.rmdir()
    except OSError:
        pass
