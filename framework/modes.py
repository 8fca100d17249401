"""The modes a run directory goes through after preflight: fit (framework/runner.py), test and
predict. They share one launcher: preflight in the mode, the warnings said, the run directory and
the cluster checked, the processes started (or joined) and the loop's result returned; and one
way of leaving on failure (framework/exits.py)."""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig

from framework.checkpoint.resume import check_run_dir
from framework.config.build import build
from framework.console import warn
from framework.errors import UserError
from framework.exits import leave_on_failure
from framework.launch.elastic import WorkerFailed, may_start_local_workers, start_forkserver
from framework.launch.launcher import launch
from framework.loop.state import RunMode
from framework.preflight import Prepared, prepare
from framework.preflight.memory import memory_advice
from framework.results import TEST_METRICS_FILE, merge_predictions, metrics_table, test_record, write_json
from framework.summary import add_to_summary


@dataclass
class Launched:
    prepared: Prepared
    result: object  # the loop's result (framework/loop/state.py FitResult)
    writer: bool  # whether this process writes the run's files (rank zero where a scheduler started them)
    started_at: float


def launch_mode(cfg: DictConfig, mode: RunMode, output_dir: Path, restarted: bool = False,
                 before: Callable[[Prepared, bool], None] | None = None) -> Launched:
    """Prepare `cfg` in `mode` and launch it. `before(prepared, writer)` runs after every check
    and before any process starts (what the mode writes first: a fit's config.yaml). `restarted`:
    a job its scheduler restarted continues from its checkpoints. A worker killed for memory is
    told what `framework plan` estimated."""
    if may_start_local_workers(cfg.get("devices", 1), cfg.get("num_nodes", 1), str(cfg.strategy.get("_target_", ""))):
        start_forkserver()  # its imports overlap the preflight below (framework/launch/elastic.py)
    prepared = prepare(cfg, mode=mode)
    for warning in prepared.warnings:
        warn(warning)
    cluster = prepared.plugins.cluster
    cluster.validate(prepared.devices, prepared.resolved.num_nodes)
    check_run_dir(prepared.resolved, output_dir, restarted=restarted or cluster.restarted)
    # Processes a scheduler started (torchrun, srun, mpirun) each run this; rank zero writes.
    writer = not cluster.creates_processes_externally or cluster.global_rank() == 0
    if before is not None:
        before(prepared, writer)
    started_at = time.time()
    try:
        result = launch(prepared.config, output_dir, prepared.plugins, prepared.world_size, mode)
    except WorkerFailed as err:
        if getattr(err, "out_of_memory", False):
            err.args = (f"{err}\n{memory_advice(prepared)}",)
        raise
    return Launched(prepared, result, writer, started_at)


def record_test(tested: dict, output_dir: Path, prepared: Prepared, started_at: float) -> dict:
    """test_metrics.json in the run directory, and the metrics as a table on the console."""
    record = test_record(tested, strategy=prepared.plugins.strategy.name, precision=prepared.plugins.precision.name,
                         world_size=prepared.world_size, wall_time_s=round(time.time() - started_at, 3))
    path = write_json(output_dir / TEST_METRICS_FILE, record)
    where = f"{tested['checkpoint']} (step {tested['step']})" if tested.get("checkpoint") else "the final weights"
    print(metrics_table(tested["metrics"], f"test of {where}: {path}"), flush=True)
    return record


def run_test(cfg: DictConfig, output_dir: Path, chosen: str, log: bool = False) -> dict:
    """`framework test`: score the checkpoint `cfg.ckpt_path` names on the test split with cfg's
    strategy at its world size, and write test_metrics.json (and the test into summary.json) in
    `output_dir`. `chosen`: why that checkpoint (recorded); `log`: also send the scores to the
    run's loggers, at the checkpoint's step."""
    with leave_on_failure(bool(cfg.get("debug", False)), output_dir):
        launched = launch_mode(cfg, RunMode("test"), output_dir)
    tested = launched.result.tested
    if not launched.writer:
        return tested
    record = record_test({**tested, "chosen": chosen}, output_dir, launched.prepared, launched.started_at)
    if log:
        log_to_run(launched.prepared.resolved, output_dir, record["metrics"], record["step"])
    add_to_summary(output_dir, test=record)
    return record


def log_to_run(cfg: DictConfig, output_dir: Path, metrics: dict, step: int | None) -> None:
    """Send metrics to the loggers of the run's config (a row of metrics.csv, a TensorBoard scalar,
    ...) in the run directory, at `step`; loggers that cannot be built are named and skipped."""
    step = int(step or 0)
    for name, node in (cfg.get("logger") or {}).items():
        try:
            logger = build(node, f"logger.{name}", save_dir=str(output_dir))
        except UserError as err:
            warn(f"not logged to logger.{name}: {err}")
            continue
        logger.log_metrics(metrics, step)
        logger.finalize()
        print(f"logged to logger.{name} at step {step}", flush=True)


def run_predict(cfg: DictConfig, out: Path, split: str) -> int:
    """`framework predict`: one row per sample of `split` with what the task predicts for the
    checkpoint `cfg.ckpt_path` names, computed with cfg's strategy at its world size (each rank
    its share), merged in data-set order into `out` (.jsonl or .parquet). Returns the rows."""
    parts = out.parent / f".{out.name}.parts"  # each rank's rows, on storage every rank sees
    state = {"writer": True}  # until the cluster says otherwise (processes started outside: rank zero merges)

    def clear(_, writer: bool) -> None:  # the other ranks write there only after the process group forms
        state["writer"] = writer
        if writer:
            shutil.rmtree(parts, ignore_errors=True)
        parts.mkdir(parents=True, exist_ok=True)

    try:
        with leave_on_failure(bool(cfg.get("debug", False)), parts):
            launch_mode(cfg, RunMode("predict", split), parts, before=clear)
        return merge_predictions(sorted(parts.glob("predictions-rank*.jsonl")), out) if state["writer"] else 0
    finally:
        if state["writer"]:
            shutil.rmtree(parts, ignore_errors=True)
