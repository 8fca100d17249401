"""One job of a sweep (`-m`), beside the sweeps (framework/sweeps.py): skipped when a re-run with
resume=auto finds it finished; a failure is recorded in its summary.json and said, and the sweep
goes on (the job returns None, which Optuna records as a failed trial); a preemption stops the
whole sweep. The fit itself is given (framework/runner.py's), so this room needs nothing above it."""
from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig

from framework.errors import ExitCode, RunExit, UserError, report
from framework.exits import describe, hydra_output_dir, say_failure
from framework.launch.elastic import WorkerFailed
from framework.loop.nonfinite import Diverged
from framework.loop.preemption import Preempted
from framework.summary import run_summary, write_summary
from framework.sweep_record import SUMMARY_FILE
from framework.sweeps import SweepJob, finished_objective


def run_sweep_job(cfg: DictConfig, output_dir, job: SweepJob, fit: Callable[[DictConfig, Path], float | None]):
    output_dir = Path(output_dir) if output_dir else hydra_output_dir(str(cfg.get("name", "")))
    if cfg.get("resume") == "auto":
        done, objective = finished_objective(output_dir, job)
        if done:
            print(f"job {job.num} ({' '.join(job.overrides)}): finished in an earlier run of this sweep; skipped "
                  f"({cfg.trainer.objective}={objective})", flush=True)
            return objective
    started_at = time.time()
    try:
        return fit(cfg, output_dir)
    except Preempted as err:
        say_failure(err)
        raise RunExit(ExitCode.PREEMPTED) from None
    except Diverged as err:  # its summary.json (status diverged) is written: a failed job, the sweep goes on
        say_failure(err)
        print(f"job {job.num} diverged; the sweep goes on (see {output_dir / SUMMARY_FILE})", file=sys.stderr,
              flush=True)
        return None
    except UserError as err:
        report(err)
        error = describe(err)
    except WorkerFailed as err:
        say_failure(err)
        error = describe(err).splitlines()[0]
    except Exception as err:  # a bug in one job must not lose the other jobs' results
        traceback.print_exc()
        error = f"{type(err).__name__}: {err}"
    write_summary(output_dir, run_summary(str(cfg.get("name", "")), "failed", cfg.trainer.objective, None,
                                          job.overrides, time.time() - started_at, error=error))
    print(f"job {job.num} failed; the sweep goes on (see {output_dir / SUMMARY_FILE})", file=sys.stderr, flush=True)
    return None
