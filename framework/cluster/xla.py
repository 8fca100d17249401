"""`cluster=xla`: the hosts of an XLA (TPU) slice, one process per host (SPMD drives all of a
host's devices). Every host runs the same command (e.g. `gcloud compute tpus tpu-vm ssh
--worker=all --command "python train.py accelerator=tpu strategy=xla_fsdp cluster=xla ..."`), so
the processes are created outside the framework.

Ranks come from the XLA runtime once it has started (in the worker: `process_index`,
`process_count`), and before that from the variables the TPU VM sets and the runtime itself reads
(TPU_WORKER_ID, TPU_WORKER_HOSTNAMES): reading the runtime earlier would start it before the
strategy could put it in SPMD mode. Never auto-detected; a lone host is rank 0 of 1.
"""
from __future__ import annotations

import os
import sys

from framework.cluster.base import ClusterEnvironment
from framework.errors import ConfigError


def _runtime():
    """torch_xla's runtime module once the runtime has started in this process, else None."""
    if "torch_xla" not in sys.modules:
        return None
    import torch_xla
    import torch_xla.runtime as xr

    return xr if torch_xla._XLAC._xla_runtime_is_initialized() else None


class XLAEnvironment(ClusterEnvironment):
    """One process per XLA host; host ranks from the XLA runtime or the TPU VM's variables."""

    name = "xla"
    xla = True  # serves XLA runs only (the compatibility table reads it)

    def __init__(self, main_port: int = 8476):
        """main_port: the port of host 0's coordinator (torch_xla's default, 8476)."""
        self._port = main_port

    @staticmethod
    def detect() -> bool:
        return False

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @staticmethod
    def _hosts() -> list[str]:
        return [h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]

    @property
    def main_address(self) -> str:
        return (self._hosts() or ["localhost"])[0]

    @property
    def main_port(self) -> int:
        return self._port

    def world_size(self) -> int:
        runtime = _runtime()
        return runtime.process_count() if runtime else max(1, len(self._hosts()))

    def global_rank(self) -> int:
        runtime = _runtime()
        return runtime.process_index() if runtime else int(os.environ.get("TPU_WORKER_ID", 0))

    def local_rank(self) -> int:
        return 0  # one process per host

    def node_rank(self) -> int:
        return self.global_rank()

    def validate(self, devices: int, num_nodes: int) -> None:
        hosts = len(self._hosts())
        if hosts and num_nodes != hosts:
            raise ConfigError(f"num_nodes={num_nodes} with cluster=xla: this XLA slice has {hosts} hosts "
                              f"(TPU_WORKER_HOSTNAMES); use num_nodes={hosts}.")
