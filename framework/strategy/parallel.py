"""Shared base of the multi-process strategies: the process group and how workers start."""
from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from framework.strategy.base import Strategy


class ParallelStrategy(Strategy):
    """Joins (or creates) the default process group in `setup_environment`, and destroys it in
    `teardown`. The collectives of the base class then run over it.

    `start_method` is how the framework's launcher creates local workers: "forkserver" (the
    default) forks each worker from a clean server process; "spawn" starts a fresh interpreter
    per worker. Either way the worker receives the resolved config as plain data."""

    multi_process = True
    start_method = "forkserver"

    def __init__(self, *args, timeout_s: float = 1800.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.timeout_s = timeout_s

    def setup_environment(self) -> None:
        if not dist.is_initialized():
            cluster = self.cluster
            dist.init_process_group(
                backend=self.accelerator.distributed_backend,
                init_method=f"tcp://{cluster.main_address}:{cluster.main_port}",
                world_size=cluster.world_size(), rank=cluster.global_rank(),
                timeout=timedelta(seconds=self.timeout_s),
            )
        super().setup_environment()

    def teardown(self) -> None:
        super().teardown()
        if dist.is_initialized():
            dist.destroy_process_group()
