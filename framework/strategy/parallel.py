"""Shared base of the multi-process strategies: the process group and how workers start."""
from __future__ import annotations

import gc
import os
import socket
from datetime import timedelta

import torch.distributed as dist

from framework.console import announce_if_slow
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
            self._set_env = _export_cluster_variables(cluster)
            timeout = timedelta(seconds=self.timeout_s)
            init = {"init_method": f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"}
            if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
                # Join the elastic agent's store under a per-attempt prefix: after a restart
                # (trainer.max_restarts) the new group must not read the addresses the group it
                # replaces left there.
                store = dist.TCPStore(cluster.main_address, cluster.main_port, is_master=False, timeout=timeout)
                attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
                init = {"store": dist.PrefixStore(f"framework/attempt_{attempt}", store)}
            joining = (f"waiting for {cluster.world_size()} processes to join ({self.accelerator.distributed_backend}, "
                       f"timeout {self.timeout_s:g} s)")
            with announce_if_slow(joining, cluster.global_rank() == 0):
                dist.init_process_group(backend=self.accelerator.distributed_backend, world_size=cluster.world_size(),
                                        rank=cluster.global_rank(), timeout=timeout, **init)
        super().setup_environment()

    def teardown(self) -> None:
        super().teardown()
        if dist.is_initialized():
            # a wrapped model that only a reference cycle still holds is freed first: a DDP reducer
            # outliving its gloo group can hang in the group's destructor (a full collection costs
            # ~0.15 s in a process with many objects: only here, where a group goes)
            gc.collect()
            dist.destroy_process_group()
        for key in getattr(self, "_set_env", ()):
            os.environ.pop(key, None)


def _export_cluster_variables(cluster) -> list[str]:
    """Set RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the cluster where no
    launcher did (a lone process, or tasks srun/mpirun/jsrun started): libraries read them
    (DeepSpeed reads LOCAL_RANK). Returns the names it set, removed again at teardown."""
    port = cluster.main_port
    if not port:  # a lone process: any free port

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    values = {"RANK": cluster.global_rank(), "LOCAL_RANK": cluster.local_rank(), "WORLD_SIZE": cluster.world_size(),
              "MASTER_ADDR": cluster.main_address, "MASTER_PORT": port}
    added = [key for key in values if key not in os.environ]
    for key in added:
        os.environ[key] = str(values[key])
    return added
