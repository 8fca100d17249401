"""`framework.run(cfg)`: validate, build the plugins, launch, fit, return the objective."""
from __future__ import annotations

import signal
import sys
from dataclasses import dataclass
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from framework.checkpoint.format import check_files, list_checkpoints, read_meta
from framework.config.compatibility import Plan, check_compatibility
from framework.config.targets import check_targets
from framework.config.validate import check_values
from framework.errors import ConfigError, UserError, report, runner_state, wants_traceback
from framework.launch.elastic import WorkerFailed
from framework.launch.launcher import launch
from framework.loop.preemption import EXIT_PREEMPTED, Preempted
from framework.plugins import Plugins, build_plugins
from framework.reproduce import write_recipe
from framework.sweeps import SUMMARY_FILE, current_job, finished_objective, write_summary
from framework.strategy.base import LoopSettings


def hydra_output_dir(name: str) -> Path:
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path("outputs") / name


def remove_fresh_hydra_dir(output_dir) -> None:
    """A run refused before it started leaves nothing behind: remove the directory Hydra made
    for it if it holds only Hydra's own records (never a directory with results in it)."""
    from hydra.core.hydra_config import HydraConfig

    if output_dir is not None or not HydraConfig.initialized():
        return
    path = Path(HydraConfig.get().runtime.output_dir)
    try:  # processes a scheduler started together may all be refused, and remove it at once
        if path.is_dir() and all(p.name in (".hydra", "train.log") or p.suffix == ".log" for p in path.iterdir()):
            if all(f.stat().st_size == 0 for f in path.glob("*.log")):
                import shutil

                shutil.rmtree(path, ignore_errors=True)
                cwd = Path.cwd().resolve()
                for parent in path.resolve().parents:  # and the empty folders above it (outputs/<date>/)
                    if parent == cwd or cwd not in parent.parents or any(parent.iterdir()):
                        break
                    parent.rmdir()
    except OSError:
        pass


def check_run_dir(cfg: DictConfig, output_dir: Path, restarted: bool = False) -> None:
    """Refuse to start a fresh run over an earlier run's checkpoints (nothing is ever lost), and
    check a given ckpt_path completely (every file present, no file truncated) before anything
    is written. A job the scheduler restarted (`restarted`) continues from its checkpoints."""
    if cfg.ckpt_path:
        path = Path(cfg.ckpt_path).expanduser()
        meta = read_meta(path)
        check_files(path, meta, list(meta["files"]))
    if cfg.resume or cfg.ckpt_path or restarted:
        return
    complete, _ = list_checkpoints(output_dir / "checkpoints")
    if complete:
        raise ConfigError(
            f"{output_dir} already holds checkpoints of an earlier run (newest: {complete[-1].path.name}). "
            "Continue it with resume=auto, or start a separate run with another name=..."
        )


def run(cfg: DictConfig, output_dir: str | Path | None = None) -> float | None:
    runner_state.entered = True
    job = current_job()
    if job is None:
        return _run_reporting(cfg, output_dir)
    return _run_sweep_job(cfg, output_dir, job)


def _run_reporting(cfg: DictConfig, output_dir, in_sweep: bool = False) -> float | None:
    """`_run`, with every user error turned into one paragraph and an exit code."""
    try:
        return _run(cfg, output_dir)
    except UserError as err:
        if not in_sweep:  # a sweep job keeps its directory: its summary.json records the failure
            remove_fresh_hydra_dir(output_dir)
        if wants_traceback(bool(cfg.get("debug", False))):
            raise
        report(err)
        raise SystemExit(2) from None
    except WorkerFailed as err:
        runner_state.last_error = f"error: {err}".splitlines()[0]
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    except Preempted as err:
        print(f"preempted: {err}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_PREEMPTED) from None


def _run_sweep_job(cfg: DictConfig, output_dir, job) -> float | None:
    """One job of a sweep: skipped when a re-run with resume=auto finds it finished; a failure is
    recorded in its summary.json and reported, and the sweep goes on (the job returns None, which
    Optuna records as a failed trial)."""
    output_dir = Path(output_dir) if output_dir else hydra_output_dir(str(cfg.get("name", "")))
    if cfg.get("resume") == "auto":
        done, objective = finished_objective(output_dir, job)
        if done:
            print(f"job {job.num} ({' '.join(job.overrides)}): finished in an earlier run of this sweep; skipped "
                  f"({cfg.trainer.objective}={objective})", flush=True)
            return objective
    started = time.time()
    try:
        return _run_reporting(cfg, output_dir, in_sweep=True)
    except SystemExit as exit_:
        if exit_.code == EXIT_PREEMPTED:
            raise  # the whole sweep process was asked to stop
        error = runner_state.last_error or f"exit code {exit_.code}"
    except Exception as err:  # a bug in one job must not lose the other jobs' results
        import traceback

        traceback.print_exc()
        error = f"{type(err).__name__}: {err}"
    write_summary(output_dir, {"name": str(cfg.get("name", "")), "status": "failed", "error": error,
                               "objective": cfg.trainer.objective, "objective_value": None,
                               "overrides": job.overrides, "wall_time_s": round(time.time() - started, 3)})
    print(f"job {job.num} failed; the sweep goes on (see {output_dir / SUMMARY_FILE})", file=sys.stderr, flush=True)
    return None


@dataclass
class Prepared:
    """A validated run: the resolved config (plain containers), the plugins and the world."""

    config: dict
    resolved: DictConfig
    plugins: Plugins
    devices: int

    @property
    def world_size(self) -> int:
        return self.devices * self.resolved.num_nodes


def check_components(cfg: DictConfig) -> None:
    """Build the model (on the meta device: no memory, no init cost), data module and task once,
    so an argument their constructors refuse is reported before anything is written."""
    from framework.config.build import build
    from framework.config.meta_build import meta_device

    with meta_device():
        build(cfg.model, "model")
    build(cfg.data, "data")
    build(cfg.task, "task")


def loop_settings(cfg: DictConfig) -> LoopSettings:
    from framework.config.targets import import_target

    task = import_target(cfg.task._target_, "task")
    return LoopSettings(micro_batch_size=cfg.data.get("batch_size", 1), accumulate=cfg.trainer.accumulate,
                        clip_grad_norm=cfg.trainer.clip_grad_norm, clip_grad_value=cfg.trainer.clip_grad_value,
                        manual_optimization=not getattr(task, "automatic_optimization", True))


def prepare(cfg: DictConfig) -> Prepared:
    """Steps 1 and 2: validate the config, build the plugins, check the combination. Touches no
    device and starts no process, so it is also what tools use to check a config."""
    try:
        config = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "config"
        raise ConfigError(f"{key}: {str(err).splitlines()[0]} (an interpolation points to a key this "
                          "combination of options does not have)") from err
    resolved = OmegaConf.create(config)
    check_values(resolved)
    check_targets(resolved)
    plugins = build_plugins(resolved)
    check_components(resolved)
    devices = plugins.accelerator.resolve_devices(resolved.devices)
    check_compatibility(compatibility_plan(plugins, resolved, devices))
    return Prepared(config, resolved, plugins, devices)


def compatibility_plan(plugins: Plugins, resolved: DictConfig, devices: int) -> Plan:
    """What the compatibility table judges: the built plugins, the world and the loop settings."""
    return Plan(plugins.accelerator, plugins.strategy, plugins.precision, plugins.checkpoint_io, plugins.cluster,
                devices, resolved.num_nodes, loop_settings(resolved))


def _run(cfg: DictConfig, output_dir) -> float | None:
    prepared = prepare(cfg)
    config, resolved, plugins = prepared.config, prepared.resolved, prepared.plugins
    cluster = plugins.cluster
    output_dir = Path(output_dir) if output_dir else hydra_output_dir(resolved.name)
    cluster.validate(prepared.devices, resolved.num_nodes)
    check_run_dir(resolved, output_dir, restarted=cluster.restarted)
    # Processes a scheduler started (torchrun, srun, mpirun) each run this; rank zero writes.
    writer = not cluster.creates_processes_externally or cluster.global_rank() == 0
    output_dir.mkdir(parents=True, exist_ok=True)
    if writer:
        OmegaConf.save(resolved, output_dir / "config.yaml")
        write_recipe(config, output_dir / "recipe.yaml")
    # 3. launch and 4. fit
    started = time.time()
    metrics = launch(config, output_dir, plugins, prepared.world_size)
    if "trainer/preempted_step" in metrics:
        number = int(metrics.get("trainer/preempted_signal", 0))
        line = cluster.on_preempted() if writer else None  # e.g. requeue the SLURM job
        if line:
            print(f"{cluster.name}: {line}", file=sys.stderr, flush=True)
        raise Preempted(signal.Signals(number).name if number else "a signal", int(metrics["trainer/preempted_step"]),
                        requeued=cluster.requeued)
    if not writer:
        return metrics.get(resolved.trainer.objective)
    # 5. the objective, for sweepers
    objective_name = resolved.trainer.objective
    objective = metrics.get(objective_name)
    job = current_job()
    summary = {"name": resolved.name, "status": "completed", "objective": objective_name, "objective_value": objective,
               "overrides": job.overrides if job else [],
               "metrics": metrics, "wall_time_s": round(time.time() - started, 3),
               "strategy": plugins.strategy.name, "precision": plugins.precision.name,
               "world_size": prepared.world_size, "output_dir": str(output_dir)}
    write_summary(output_dir, summary)
    if objective is None:
        print(f"note: trainer.objective={objective_name!r} was never logged; returning None.")
    return objective
