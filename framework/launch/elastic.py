"""Start the local worker processes with torch's elastic agent.

The resolved config travels to each worker as plain containers, together with the output
directory; nothing re-reads `sys.argv` or Hydra's state, which is what keeps Hydra multirun
working (each job gets its own worker group, rendezvous port and run directory).
"""
from __future__ import annotations

import logging
import os
import sys
import tempfile
import uuid
from pathlib import Path

from framework.errors import CheckpointError, ConfigError, UserError

_USER_ERRORS = {"ConfigError": ConfigError, "CheckpointError": CheckpointError, "UserError": UserError}
_USER_ERROR_KEY = "__framework_user_error__"


def worker_entry(config: dict, output_dir: str, threads: int):
    """Module-level (picklable) entry of every worker process."""
    import torch

    torch.set_num_threads(threads)
    from framework.launch.worker import train_worker

    try:
        return train_worker(config, output_dir)
    except UserError as err:  # reported by the launching process as the user's error, exit code 2
        return {_USER_ERROR_KEY: (type(err).__name__, str(err))}


def launch_local_workers(config: dict, output_dir: Path, plugins, nproc: int) -> dict:
    """Run `nproc` workers on this node and return rank zero's result."""
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    threads = max(1, (os.cpu_count() or 1) // nproc)
    logs_dir = Path(tempfile.mkdtemp(prefix="elastic-", dir=output_dir))
    launch_config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
        rdzv_backend="c10d", rdzv_endpoint=f"{plugins.cluster.main_address}:{plugins.cluster.main_port}",
        max_restarts=config["trainer"].get("max_restarts", 0), start_method=plugins.strategy.start_method,
        monitor_interval=0.1, logs_specs=DefaultLogsSpecs(log_dir=str(logs_dir)),
        local_addr=plugins.cluster.main_address,
    )
    try:
        results = elastic_launch(launch_config, worker_entry)(config, str(output_dir), threads)
    except ChildFailedError as err:
        raise WorkerFailed(err) from None
    finally:
        _remove_tree(logs_dir)
    for rank in sorted(results):
        result = results[rank]
        if isinstance(result, dict) and _USER_ERROR_KEY in result:
            kind, message = result[_USER_ERROR_KEY]
            raise _USER_ERRORS.get(kind, UserError)(message)
    return results[0]


class WorkerFailed(RuntimeError):
    """A worker process died or raised; the first failure is shown first."""

    def __init__(self, err):
        failures = sorted(err.failures.items(), key=lambda kv: kv[1].timestamp)
        rank, first = failures[0]
        lines = [f"worker rank {rank} failed first (exit code {first.exitcode}): {first.message}"]
        details = first.error_file_data.get("message", {}) if isinstance(first.error_file_data, dict) else {}
        trace = details.get("extraInfo", {}).get("py_callstack") if isinstance(details, dict) else None
        if trace:
            lines.append(trace.rstrip())
        for other_rank, other in failures[1:]:
            lines.append(f"worker rank {other_rank} also failed (exit code {other.exitcode})")
        super().__init__("\n".join(lines))
        self.exit_code = first.exitcode


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
