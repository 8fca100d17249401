"""Decide how the worker runs: in this process, or joining processes created outside."""
from __future__ import annotations

from pathlib import Path

from framework.launch.worker import train_worker


def launch(config: dict, output_dir: Path, plugins, world_size: int) -> dict[str, float]:
    """Run `train_worker` for this process's share of the world and return rank zero's metrics.

    One process (or processes the cluster created, e.g. torchrun/srun): run it right here.
    """
    if world_size == 1 or plugins.cluster.creates_processes_externally:
        return train_worker(config, str(output_dir))
    from framework.launch.elastic import launch_local_workers

    return launch_local_workers(config, output_dir, plugins, world_size)
