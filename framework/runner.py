"""`framework.run(cfg)`: the fit mode assembled. Preflight (framework/preflight), the launch shared
with test and predict (framework/modes.py), then what a fit leaves in its run directory: the
config and recipe it ran, summary.json, the test of its best checkpoint, the curves; the
objective returned for sweepers. A sweep's job goes through framework/sweep_job.py."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from framework.errors import ConfigError
from framework.exits import hydra_output_dir, leave_on_failure
from framework.launch.replica_groups import GROUPS_IN_A_SWEEP, launches_groups, placement, supervise
from framework.loop.nonfinite import Diverged
from framework.loop.preemption import Preempted
from framework.loop.state import RunMode
from framework.modes import launch_mode, record_test
from framework.plotting.at_end import run_figures
from framework.preflight import Prepared, prepare
from framework.reproduce import write_recipe
from framework.summary import run_summary, write_summary
from framework.sweep_job import run_sweep_job
from framework.sweeps import current_job, run_overrides

_started = False


def started() -> bool:
    """Whether `run` was entered in this process (the entry guard tells Hydra's own exits from ours)."""
    return _started


def run(cfg: DictConfig, output_dir: str | Path | None = None) -> float | None:
    """Prepare, launch and fit; returns the objective. A failure leaves with its exit code
    (framework/exits.py) after one paragraph; in a sweep, a failed job is recorded and the sweep
    goes on."""
    global _started
    _started = True
    job = current_job()
    if job is not None:
        return run_sweep_job(cfg, output_dir, job, fit)
    with leave_on_failure(bool(cfg.get("debug", False)), output_dir):
        return fit(cfg, output_dir)


def fit_replica_groups(cfg: DictConfig, output_dir: Path) -> float | None:
    """fault_tolerance=torchft started here: every refusal first, then a lighthouse and every replica
    group (framework/launch/replica_groups.py); the run directory's summary gathers theirs. The
    objective: the first group's."""
    prepared = prepare(cfg, mode=RunMode("fit"))
    output_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    ft = prepared.plugins.fault_tolerance
    groups = supervise(ft, sys.argv, output_dir, lambda line: print(line, flush=True),
                       placement(prepared.plugins.accelerator, prepared.processes_per_node, ft.replica_groups))
    first = groups["replica_groups"][0]
    objective_name = prepared.resolved.trainer.objective
    write_summary(output_dir, run_summary(prepared.resolved.name, "completed", objective_name, first.get("objective_value"),
                                          run_overrides(), time.time() - started, **groups))
    return first.get("objective_value")


def fit(cfg: DictConfig, output_dir) -> float | None:
    """The fit mode: launch, then the run directory's results; the objective (None when it was
    never logged, or the run diverged: its summary says so and Diverged is raised)."""
    output_dir = Path(output_dir) if output_dir else hydra_output_dir(cfg.name)
    if launches_groups(cfg):
        if current_job() is not None:
            raise ConfigError(GROUPS_IN_A_SWEEP)
        return fit_replica_groups(cfg, output_dir)

    def write_config(prepared: Prepared, writer: bool) -> None:
        output_dir.mkdir(parents=True, exist_ok=True)
        if writer:
            OmegaConf.save(prepared.resolved, output_dir / "config.yaml")
            write_recipe(prepared.config, output_dir / "recipe.yaml")

    launched = launch_mode(cfg, RunMode("fit"), output_dir, before=write_config)
    prepared, result = launched.prepared, launched.result
    resolved, plugins = prepared.resolved, prepared.plugins
    if result.preempted is not None:
        if launched.writer:  # e.g. requeue the SLURM job
            plugins.cluster.on_preempted(lambda line: print(f"{plugins.cluster.name}: {line}", file=sys.stderr,
                                                            flush=True))
        raise Preempted(result.preempted.signal, result.preempted.step, requeued=plugins.cluster.requeued)
    objective_name = resolved.trainer.objective
    objective = result.metrics.get(objective_name)
    if not launched.writer:
        if result.diverged is not None:
            raise Diverged(result.diverged)
        return objective
    job, diverged = current_job(), result.diverged
    summary = run_summary(resolved.name, "completed" if diverged is None else "diverged", objective_name,
                          objective if diverged is None else None, job.overrides if job else run_overrides(),
                          time.time() - launched.started_at, metrics=result.metrics, strategy=plugins.strategy.name,
                          precision=plugins.precision.name, world_size=prepared.world_size,
                          output_dir=str(output_dir))
    if diverged is not None:
        summary.update(error=f"diverged: {diverged.describe()}", diverged={
            "what": diverged.what, "step": diverged.step, "stopped_at": diverged.stopped_at,
            "policy": diverged.policy, "last_finite_checkpoint": diverged.last_finite_checkpoint})
        write_summary(output_dir, summary)
        raise Diverged(diverged)
    if result.replicas is not None:  # fault_tolerance=torchft: this group's heals and final weights' digest
        summary["replicas"] = result.replicas
    if result.tested is not None:
        summary["test"] = record_test(result.tested, output_dir, prepared, launched.started_at)
    write_summary(output_dir, summary)
    if resolved.trainer.plot and job is None:  # a sweep draws its jobs together when it ends
        for figure in run_figures(output_dir):
            print(f"curves: {figure}", flush=True)
    if objective is None:
        print(f"note: trainer.objective={objective_name!r} was never logged; returning None.")
    return objective
