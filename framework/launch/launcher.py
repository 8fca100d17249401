"""Decide how the worker runs: in this process, or joining processes created outside."""
from __future__ import annotations

from pathlib import Path

from framework.launch.elastic import launch_local_workers
from framework.loop.state import FitResult, RunMode
from framework.trainer import train_worker


def launch(config: dict, output_dir: Path, plugins, world_size: int, mode: RunMode = RunMode()) -> FitResult:
    """Run `train_worker` (in `mode`: fit, test or predict) for this process's share of the world and
    return rank zero's result.

    One process (or processes the cluster created, e.g. torchrun/srun): run it right here.
    """
    if world_size == 1 or plugins.cluster.creates_processes_externally:
        return train_worker(config, str(output_dir), mode)
    return launch_local_workers(config, output_dir, plugins, world_size, mode)
