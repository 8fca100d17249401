"""`framework.run(cfg)`: validate, build the plugins, launch, fit, return the objective."""
from __future__ import annotations

import json
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from framework.checkpoint.resume import check_run_dir
from framework.config.build import build
from framework.config.compatibility import Plan, judge, processes_per_node
from framework.config.loop_settings import loop_settings
from framework.config.targets import check_targets
from framework.config.validate import check_values
from framework.console import human_bytes
from framework.accelerator.planned import planned
from framework.construction.meta_build import meta_device
from framework.data.tokenizer import tokenizer_mismatch
from framework.models.build import build_model
from framework.errors import (ConfigError, ExitCode, RunExit, StorageError, UserError, did_you_mean, heading, report,
                              wants_traceback)
from framework.construction.activation_checkpointing import checkpoint_units
from framework.launch.elastic import WorkerFailed
from framework.launch.launcher import launch
from framework.loop.nonfinite import Diverged
from framework.loop.preemption import Preempted
from framework.loop.state import Stage
from framework.planning.memory import beyond_memory, estimate, model_stats
from framework.paths import check_creatable_dir, with_absolute_paths
from framework.plotting.at_end import run_figures
from framework.plugins import Plugins, build_plugins
from framework.reproduce import write_recipe
from framework.results import TEST_METRICS_FILE, merge_predictions, metrics_table, test_record, write_json
from framework.sweeps import SUMMARY_FILE, current_job, finished_objective, run_overrides, write_summary
from framework.tasks.fit_check import check_compilable, check_fit, validation_metric_names

# How each way a run can fail leaves the process (framework/errors.py documents the codes).
EXIT_CODES = {StorageError: ExitCode.STORAGE, UserError: ExitCode.USER_ERROR, WorkerFailed: ExitCode.FAILED,
              Preempted: ExitCode.PREEMPTED, Diverged: ExitCode.DIVERGED}
_started = False


def started() -> bool:
    """Whether `run` was entered in this process (the entry guard tells Hydra's own exits from ours)."""
    return _started


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


def run(cfg: DictConfig, output_dir: str | Path | None = None) -> float | None:
    """Prepare, launch and fit; returns the objective. A failure leaves with its exit code
    (EXIT_CODES) after one paragraph; in a sweep, a failed job is recorded and the sweep goes on."""
    global _started
    _started = True
    job = current_job()
    if job is None:
        return _run_single(cfg, output_dir)
    return _run_sweep_job(cfg, output_dir, job)


def _exit_code(err: BaseException) -> ExitCode:
    return next(code for kind, code in EXIT_CODES.items() if isinstance(err, kind))


def _describe(err: BaseException) -> str:
    if isinstance(err, Preempted):
        return f"preempted: {err}"
    if isinstance(err, Diverged):
        return f"diverged: {err}"
    return f"{heading(err)}: {err}"


def _run_single(cfg: DictConfig, output_dir) -> float | None:
    try:
        return _train(cfg, output_dir)
    except UserError as err:
        remove_fresh_hydra_dir(output_dir)
        if wants_traceback(bool(cfg.get("debug", False))):
            raise
        report(err)
        raise RunExit(_exit_code(err)) from None
    except (WorkerFailed, Preempted, Diverged) as err:
        print(_describe(err), file=sys.stderr, flush=True)
        raise RunExit(_exit_code(err)) from None


def _run_sweep_job(cfg: DictConfig, output_dir, job) -> float | None:
    """One job of a sweep: skipped when a re-run with resume=auto finds it finished; a failure is
    recorded in its summary.json and reported, and the sweep goes on (the job returns None, which
    Optuna records as a failed trial). Preemption stops the whole sweep."""
    output_dir = Path(output_dir) if output_dir else hydra_output_dir(str(cfg.get("name", "")))
    if cfg.get("resume") == "auto":
        done, objective = finished_objective(output_dir, job)
        if done:
            print(f"job {job.num} ({' '.join(job.overrides)}): finished in an earlier run of this sweep; skipped "
                  f"({cfg.trainer.objective}={objective})", flush=True)
            return objective
    started_at = time.time()
    try:
        return _train(cfg, output_dir)
    except Preempted as err:
        print(_describe(err), file=sys.stderr, flush=True)
        raise RunExit(ExitCode.PREEMPTED) from None
    except Diverged as err:  # its summary.json (status diverged) is written: a failed job, the sweep goes on
        print(_describe(err), file=sys.stderr, flush=True)
        print(f"job {job.num} diverged; the sweep goes on (see {output_dir / SUMMARY_FILE})", file=sys.stderr,
              flush=True)
        return None
    except UserError as err:
        report(err)
        error = _describe(err)
    except WorkerFailed as err:
        print(_describe(err), file=sys.stderr, flush=True)
        error = _describe(err).splitlines()[0]
    except Exception as err:  # a bug in one job must not lose the other jobs' results
        traceback.print_exc()
        error = f"{type(err).__name__}: {err}"
    write_summary(output_dir, {"name": str(cfg.get("name", "")), "status": "failed", "error": error,
                               "objective": cfg.trainer.objective, "objective_value": None,
                               "overrides": job.overrides, "wall_time_s": round(time.time() - started_at, 3)})
    print(f"job {job.num} failed; the sweep goes on (see {output_dir / SUMMARY_FILE})", file=sys.stderr, flush=True)
    return None


@dataclass
class Prepared:
    """A config through the one preparation pipeline: what it resolved to, the plugins, the world
    and the model built on the meta device, or the problems found (every one, not the first)."""

    problems: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)  # the compatibility table's share of the problems
    warnings: list[str] = field(default_factory=list)
    config: dict | None = None  # the resolved config as plain containers (what workers receive)
    resolved: DictConfig | None = None
    plugins: Plugins | None = None
    devices: int | None = None
    model: object = None  # built on the meta device: no memory, no initialisation
    activation_bytes: int = 0  # what one micro-batch's forward keeps for backward (measured on meta)
    logged: set[str] | None = None  # the metric names a validation logs (None: not known before the run)

    @property
    def world_size(self) -> int:
        """Processes in the whole job (one per device, or one per node under SPMD)."""
        return processes_per_node(self.plugins.strategy, self.devices) * self.resolved.num_nodes

    def raise_problems(self) -> "Prepared":
        if self.problems:
            raise ConfigError("\n".join(self.problems))
        return self


def prepare(cfg: DictConfig, strict: bool = True, stage: Stage = Stage(), device_memory: int | None = None,
            elsewhere: bool = False) -> Prepared:
    """Steps 1 and 2 of a run, and all of `framework validate` and `framework plan`: resolve the
    config, check values and every `_target_` (trust, imports, signatures), build the plugins,
    build model (on the meta device), data and task, and judge the combination. Touches no device
    and starts no process. Every problem is collected; `strict` raises them as one ConfigError.
    `stage`: fit, test (`framework test`: the data must have a test split) or predict (the task
    must predict, the data have the split). `elsewhere` (`framework plan --device`): judged for a
    machine that has the configured accelerator, with `device_memory` bytes per device."""
    prepared = Prepared()
    problems = prepared.problems

    def attempt(step):
        try:
            return step()
        except UserError as err:
            problems.extend(str(err).splitlines())
            return None

    try:
        prepared.config = with_absolute_paths(OmegaConf.to_container(cfg, resolve=True))
    except OmegaConfBaseException as err:
        verdict = _user_error_inside(err)
        if verdict is not None:  # a resolver's own verdict (a tokenizer file that is missing)
            problems.extend(str(verdict).splitlines())
            return prepared.raise_problems() if strict else prepared
        key = getattr(err, "full_key", None) or "config"
        problems.append(f"{key}: {str(err).splitlines()[0]} (an interpolation points to a key this combination "
                        "of options does not have)")
        return prepared.raise_problems() if strict else prepared
    resolved = prepared.resolved = OmegaConf.create(prepared.config)
    attempt(lambda: check_values(resolved))
    attempt(lambda: check_targets(resolved))
    if not problems:  # building from a config that failed those would only repeat them
        prepared.plugins = attempt(lambda: build_plugins(resolved))
        if prepared.plugins is not None and elsewhere:
            plugins = prepared.plugins
            plugins.accelerator = plugins.strategy.accelerator = planned(plugins.accelerator, device_memory)
        prepared.model, prepared.activation_bytes, prepared.logged = attempt(
            lambda: build_components(resolved, prepared.plugins, stage, prepared.warnings)) or (None, 0, None)
    if prepared.plugins is not None:
        prepared.devices = attempt(lambda: prepared.plugins.accelerator.resolve_devices(resolved.devices))
    if prepared.devices is not None:
        plan = compatibility_plan(prepared.plugins, resolved, prepared.devices)
        prepared.refusals, judged = judge(plan)
        prepared.warnings.extend(judged)
        problems.extend(prepared.refusals)
        wrong, untouched = monitor_problems(resolved, prepared.logged if stage.name == "fit" else None)
        problems.extend(wrong)
        prepared.warnings.extend(untouched)
        if not prepared.refusals:  # the engine behind the strategy judges its own settings last
            prepared.plugins.strategy.configure_loop(plan.loop)
            if prepared.model is not None:
                problems.extend(prepared.plugins.precision.model_problems(prepared.model))
            problems.extend(prepared.plugins.strategy.problems(prepared.model))
            if prepared.model is not None and not problems:
                too_large = beyond_memory(prepared.plugins, model_stats(resolved, prepared.plugins, prepared.model)[0],
                                          prepared.world_size, processes_per_node(prepared.plugins.strategy,
                                                                                  prepared.devices),
                                          prepared.activation_bytes, MEMORY_ADVICE)
                if too_large:
                    prepared.refusals.append(too_large)
                    problems.append(too_large)
    return prepared.raise_problems() if strict else prepared


def _user_error_inside(err: BaseException) -> UserError | None:
    """The user error a resolver raised, from inside OmegaConf's wrapping of it (a chain of causes)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, UserError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


SHIPPED_MONITOR = "val/loss"  # what conf/ sets for the checkpoint's and early stopping's monitor and the objective


def monitor_problems(cfg: DictConfig, logged: set[str] | None) -> tuple[list[str], list[str]]:
    """(refusals, warnings): a validation metric that a setting names (the checkpoint's monitor,
    early stopping's, the objective) must be one the validation logs, else best-checkpoint
    selection is quietly off and the objective null. A name the user chose is refused; the shipped
    default (val/loss) under a task that logs no loss is a warning, so a task of one's own runs
    with the shipped config."""
    if not logged:
        return [], []
    named = {f"callbacks.{name}.monitor": node.get("monitor") for name, node in (cfg.get("callbacks") or {}).items()
             if isinstance(node, DictConfig) and "monitor" in node}
    objective = named["trainer.objective"] = cfg.trainer.get("objective")
    refusals, warnings = [], []
    testing = isinstance(objective, str) and objective.startswith("test/")
    if testing:
        if not cfg.trainer.get("test_at_end"):
            refusals.append(f"trainer.objective={objective!r} is a test metric, logged only when the run tests at its "
                            "end: set trainer.test_at_end=true, or choose a val/ metric.")
        logged = logged | {"test/" + name.split("/", 1)[1] for name in logged}  # test/ scores with the same metrics
    for key, value in named.items():
        if not (isinstance(value, str) and value.startswith(("val/", "test/"))) or value in logged:
            continue
        message = (f"{key}={value!r} is never logged: {'the run' if testing else 'a validation'} logs "
                   f"{', '.join(sorted(logged))}."
                   f"{did_you_mean(value, logged)} Set {key} to one of them.")
        if value == SHIPPED_MONITOR:
            warnings.append(message.replace(" is never logged:", " (the shipped default) is never logged by this "
                                            "task, so it selects nothing:"))
        else:
            refusals.append(message)
    return refusals, warnings


def build_components(cfg: DictConfig, plugins: Plugins | None = None,
                     stage: Stage = Stage(), warnings: list | None = None) -> tuple[object, int, set[str] | None]:
    """Build the model (on the meta device: no memory, no init cost), data module and task once,
    so an argument their constructors refuse is reported before anything is written, and pass one
    batch through them (framework/tasks/fit_check.py); returns the meta model (its size is what
    `framework plan` reports) and the activation bytes of one micro-batch (what the forward keeps
    for backward; with trainer.activation_checkpointing the units' inputs and one unit's
    activations, live again while backward recomputes it), and the metric names a validation logs."""
    with meta_device():
        model = build_model(cfg.model)
        if cfg.get("adapter"):  # the adapter's layers, and its refusals (targets, rank), before launch
            model = build(cfg.adapter, "adapter").apply(model)
    data = build(cfg.data, "data")
    for key, (path, fix) in data.written_paths().items():
        check_creatable_dir(path, key, fix)
    sources = data.problems() + test_split_problems(cfg, data, stage) + data.run_problems(cfg.trainer, stage.name)
    if sources:
        raise ConfigError("\n".join(sources))
    if warnings is not None:
        warnings.extend(data.warnings())
    mismatch = tokenizer_mismatch(cfg.model.get("pretrained"), data)
    if mismatch:
        raise ConfigError(mismatch)
    task = build(cfg.task, "task")
    if stage.name == "predict" and not task.can_predict:
        raise ConfigError(f"framework predict: the task ({type(task).__name__}) defines no predict_step; give it one "
                          "(what it predicts for each sample: framework/tasks/base.py), or use a built-in task.")
    batch_size = int(cfg.data.get("batch_size", 2) or 2)
    logged = validation_metric_names(model, data, task)
    if plugins is not None and cfg.trainer.get("compile"):
        check_compilable(model, data, task, plugins.strategy, bool(cfg.trainer.get("activation_checkpointing")))
    if plugins is None or not cfg.trainer.get("activation_checkpointing"):
        return model, check_fit(model, data, task, batch_size, device_type(plugins)), logged
    whole = check_fit(model, data, task, batch_size, device_type(plugins))
    count = checkpoint_units(plugins.strategy.units(model))
    kept = check_fit(model, data, task, batch_size, device_type(plugins))
    return model, kept + (max(whole - kept, 0) // count if count else 0), logged


def device_type(plugins: Plugins | None) -> str:
    """The device the run computes on (whose attention kernels the activations are measured for)."""
    return plugins.accelerator.name if plugins is not None else "cpu"


def test_split_problems(cfg: DictConfig, data, stage: Stage) -> list[str]:
    """Testing (`framework test`, trainer.test_at_end, predictions of the test split) needs data
    with a test split."""
    if stage.name == "test":
        asked = "framework test"
    elif stage.name == "predict" and stage.split == "test":
        asked = "framework predict --split test"
    elif cfg.trainer.get("test_at_end"):
        asked = "trainer.test_at_end=true"
    else:
        return []
    if data.has_test_split:
        return []
    return [f"{asked}: the data ({type(data).__name__}) has no test split. "
            f"{data.test_split_hint(trained=stage.name != 'fit')}"]


def compatibility_plan(plugins: Plugins, resolved: DictConfig, devices: int) -> Plan:
    """What the compatibility table judges: the built plugins, the world and the loop settings."""
    return Plan(plugins.accelerator, plugins.strategy, plugins.precision, plugins.checkpoint_io, plugins.cluster,
                devices, resolved.num_nodes, loop_settings(resolved))


def memory_advice(prepared: Prepared) -> str:
    """What `framework plan` estimated per rank for this run, and what needs less."""
    stats, _ = model_stats(prepared.resolved, prepared.plugins, prepared.model)
    states = estimate(prepared.plugins.strategy, stats, prepared.world_size)
    per_rank = states.device + states.host + prepared.activation_bytes
    return (f"framework plan estimated {human_bytes(per_rank)} per rank ({prepared.plugins.strategy.name}: "
            f"{states.formula} for the model states, plus one micro-batch's activations). {MEMORY_ADVICE}")


MEMORY_ADVICE = ("To need less: a smaller model, a sharding strategy (strategy=fsdp or deepspeed_stage_3), CPU offload "
                 "(fsdp_cpu_offload, deepspeed_stage_3_offload), trainer.activation_checkpointing=true, a smaller "
                 "data.batch_size (trainer.accumulate keeps the batch), or fewer processes per node (devices=...).")


def _train(cfg: DictConfig, output_dir) -> float | None:
    prepared = prepare(cfg)
    for warning in prepared.warnings:
        print(f"WARNING: {warning}", file=sys.stderr, flush=True)
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
    started_at = time.time()
    try:
        result = launch(config, output_dir, plugins, prepared.world_size)
    except WorkerFailed as err:
        if getattr(err, "out_of_memory", False):
            err.args = (f"{err}\n{memory_advice(prepared)}",)
        raise
    if result.preempted is not None:
        line = cluster.on_preempted() if writer else None  # e.g. requeue the SLURM job
        if line:
            print(f"{cluster.name}: {line}", file=sys.stderr, flush=True)
        raise Preempted(result.preempted.signal, result.preempted.step, requeued=cluster.requeued)
    metrics = result.metrics
    if not writer:
        if result.diverged is not None:
            raise Diverged(result.diverged)
        return metrics.get(resolved.trainer.objective)
    # 5. the objective, for sweepers
    objective_name = resolved.trainer.objective
    objective = metrics.get(objective_name)
    job = current_job()
    diverged = result.diverged
    summary = {"name": resolved.name, "status": "completed" if diverged is None else "diverged",
               "objective": objective_name, "objective_value": objective if diverged is None else None,
               "overrides": job.overrides if job else run_overrides(),
               "metrics": metrics, "wall_time_s": round(time.time() - started_at, 3),
               "strategy": plugins.strategy.name, "precision": plugins.precision.name,
               "world_size": prepared.world_size, "output_dir": str(output_dir)}
    if diverged is not None:
        summary.update(error=f"diverged: {diverged.describe()}", diverged={
            "what": diverged.what, "step": diverged.step, "stopped_at": diverged.stopped_at,
            "policy": diverged.policy, "last_finite_checkpoint": diverged.last_finite_checkpoint})
        write_summary(output_dir, summary)
        raise Diverged(diverged)
    if result.tested is not None:
        summary["test"] = _record_test(result.tested, output_dir, prepared, started_at)
    write_summary(output_dir, summary)
    if resolved.trainer.plot and job is None:  # a sweep draws its jobs together when it ends
        for figure in run_figures(output_dir):
            print(f"curves: {figure}", flush=True)
    if objective is None:
        print(f"note: trainer.objective={objective_name!r} was never logged; returning None.")
    return objective


def _record_test(tested: dict, output_dir: Path, prepared: Prepared, started_at: float) -> dict:
    """test_metrics.json in the run directory, and the metrics as a table on the console."""
    record = test_record(tested, strategy=prepared.plugins.strategy.name, precision=prepared.plugins.precision.name,
                         world_size=prepared.world_size, wall_time_s=round(time.time() - started_at, 3))
    path = write_json(output_dir / TEST_METRICS_FILE, record)
    where = f"{tested['checkpoint']} (step {tested['step']})" if tested.get("checkpoint") else "the final weights"
    print(metrics_table(tested["metrics"], f"test of {where}: {path}"), flush=True)
    return record


def _launch_stage(cfg: DictConfig, stage: Stage, output_dir: Path, clear: Path | None = None):
    """Prepare `cfg` at `stage` and launch it; returns (prepared, the loop's result, whether this
    process writes the results). `clear`: a directory the writer empties before launch (the
    other ranks write there only after the process group forms, which needs the writer). A
    failure leaves like a run's (one paragraph, its exit code)."""
    try:
        prepared = prepare(cfg, stage=stage)
        for warning in prepared.warnings:
            print(f"WARNING: {warning}", file=sys.stderr, flush=True)
        check_run_dir(prepared.resolved, output_dir)  # every file of ckpt_path there, none truncated
        cluster = prepared.plugins.cluster
        cluster.validate(prepared.devices, prepared.resolved.num_nodes)
        writer = not cluster.creates_processes_externally or cluster.global_rank() == 0
        if clear is not None:
            if writer:
                shutil.rmtree(clear, ignore_errors=True)
            clear.mkdir(parents=True, exist_ok=True)
        started_at = time.time()
        result = launch(prepared.config, output_dir, prepared.plugins, prepared.world_size, stage)
    except UserError as err:
        if wants_traceback(bool(cfg.get("debug", False))):
            raise
        report(err)
        raise RunExit(_exit_code(err)) from None
    except WorkerFailed as err:
        print(_describe(err), file=sys.stderr, flush=True)
        raise RunExit(_exit_code(err)) from None
    return prepared, result, writer, started_at


def run_test(cfg: DictConfig, output_dir: Path, chosen: str, log: bool = False) -> dict:
    """`framework test`: prepare `cfg` at the test stage, score the checkpoint `cfg.ckpt_path`
    names on the test split with cfg's strategy at its world size, and write test_metrics.json
    (and the test into summary.json) in `output_dir`. `chosen`: why that checkpoint (recorded);
    `log`: also send the scores to the run's loggers, at the checkpoint's step."""
    prepared, result, writer, started_at = _launch_stage(cfg, Stage("test"), output_dir)
    if not writer:
        return result.tested
    record = _record_test({**result.tested, "chosen": chosen}, output_dir, prepared, started_at)
    if log:
        log_to_run(prepared.resolved, output_dir, record["metrics"], record["step"])
    summary_path = output_dir / SUMMARY_FILE
    try:
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    except (OSError, ValueError):
        summary = {}  # an unreadable summary is replaced, not trusted
    write_summary(output_dir, {**summary, "test": record})
    return record


def log_to_run(cfg: DictConfig, output_dir: Path, metrics: dict, step: int | None) -> None:
    """Send metrics to the loggers of the run's config (a row of metrics.csv, a TensorBoard scalar,
    ...) in the run directory, at `step`; loggers that cannot be built are named and skipped."""
    step = int(step or 0)
    for name, node in (cfg.get("logger") or {}).items():
        try:
            logger = build(node, f"logger.{name}", save_dir=str(output_dir))
        except UserError as err:
            print(f"WARNING: not logged to logger.{name}: {err}", file=sys.stderr, flush=True)
            continue
        logger.log_metrics(metrics, step)
        logger.finalize()
        print(f"logged to logger.{name} at step {step}", flush=True)


def run_predict(cfg: DictConfig, out: Path, split: str) -> int:
    """`framework predict`: one row per sample of `split` with what the task predicts for the
    checkpoint `cfg.ckpt_path` names, computed with cfg's strategy at its world size (each rank
    its share), merged in data-set order into `out` (.jsonl or .parquet). Returns the rows."""
    parts = out.parent / f".{out.name}.parts"  # each rank's rows, on storage every rank sees
    writer = True  # until the cluster says otherwise (processes started outside: rank zero merges)
    try:
        _, _, writer, _ = _launch_stage(cfg, Stage("predict", split), parts, clear=parts)
        return merge_predictions(sorted(parts.glob("predictions-rank*.jsonl")), out) if writer else 0
    finally:
        if writer:
            shutil.rmtree(parts, ignore_errors=True)
