"""The base of clusters whose launcher describes the world in environment variables (torchrun,
a Kubeflow PyTorchJob): MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK, plus a variable only that
launcher sets (how it is detected) and, where it runs several processes per node, their local rank."""
from __future__ import annotations

import os

from framework.cluster.base import ClusterEnvironment


class EnvironmentVariablesCluster(ClusterEnvironment):
    """Ranks and the main address read from the launcher's environment variables."""

    #: the variables the launcher must have set
    required: tuple[str, ...] = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
    #: a variable only this launcher sets (auto-detection); with the required ones
    marker: str = ""
    #: the variable with a process's rank on its node; None: one process per node (local rank 0)
    local_rank_variable: str | None = None
    #: the variable with the node's rank (0 when unset)
    node_rank_variable: str = "RANK"

    @classmethod
    def detect(cls) -> bool:
        return bool(cls.marker) and cls.marker in os.environ and all(key in os.environ for key in cls.required)

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
        return int(os.environ[self.local_rank_variable]) if self.local_rank_variable else 0

    def node_rank(self) -> int:
        return int(os.environ.get(self.node_rank_variable, 0))

    def missing_variables(self) -> list[str]:
        """The required variables the launcher did not set (validate names them)."""
        return [key for key in self.required if key not in os.environ]
