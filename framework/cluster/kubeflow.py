"""`cluster=kubeflow`: a Kubeflow PyTorchJob, one process per pod."""
from __future__ import annotations

import os

from framework.cluster.base import ClusterEnvironment
from framework.errors import ConfigError

REQUIRED = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")


class KubeflowEnvironment(ClusterEnvironment):
    """The training operator starts one pod per replica and sets MASTER_ADDR, MASTER_PORT,
    WORLD_SIZE (the number of pods) and RANK (this pod). Each pod runs one process, so a pod is a
    node: local rank 0, node rank = RANK. Never auto-detected: these variables look exactly like a
    plain torchrun's, so choose it with `cluster=kubeflow`."""

    name = "kubeflow"

    @staticmethod
    def detect() -> bool:
        return "KUBERNETES_PORT" in os.environ and all(key in os.environ for key in REQUIRED)

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ["MASTER_ADDR"]

    @property
    def main_port(self) -> int:
        return int(os.environ["MASTER_PORT"])

    def world_size(self) -> int:
        return int(os.environ["WORLD_SIZE"])

    def global_rank(self) -> int:
        return int(os.environ["RANK"])

    def local_rank(self) -> int:
        return 0

    def node_rank(self) -> int:
        return int(os.environ["RANK"])

    def validate(self, devices: int, num_nodes: int) -> None:
        missing = [key for key in REQUIRED if key not in os.environ]
        if missing:
            raise ConfigError(f"cluster=kubeflow, but {', '.join(missing)} is not set: this is not a pod of a "
                              "PyTorchJob (the training operator sets them).")
        if devices != 1:
            raise ConfigError(f"devices={devices} with cluster=kubeflow: a PyTorchJob runs one process per pod; "
                              "set devices=1 and scale with the job's replicas.")
        if self.world_size() != num_nodes:
            raise ConfigError(f"num_nodes={num_nodes}, but the PyTorchJob has {self.world_size()} pod(s) "
                              f"(WORLD_SIZE): set num_nodes={self.world_size()}.")
