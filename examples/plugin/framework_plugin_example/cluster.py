"""`cluster=mysched`: processes started by a scheduler of our own ("mysched"), which tells each
process its place through MYSCHED_* variables."""
from __future__ import annotations

import os

from framework.cluster.base import ClusterEnvironment
from framework.errors import ConfigError

VARIABLES = ("MYSCHED_RANK", "MYSCHED_WORLD", "MYSCHED_LOCAL_RANK", "MYSCHED_NODE", "MYSCHED_MAIN")


class MySchedEnvironment(ClusterEnvironment):
    """Ranks from MYSCHED_RANK / MYSCHED_LOCAL_RANK / MYSCHED_NODE, the world size from
    MYSCHED_WORLD, the rendezvous from MYSCHED_MAIN (host:port)."""

    name = "mysched"

    @staticmethod
    def detect() -> bool:
        return all(key in os.environ for key in VARIABLES)

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ["MYSCHED_MAIN"].rsplit(":", 1)[0]

    @property
    def main_port(self) -> int:
        return int(os.environ["MYSCHED_MAIN"].rsplit(":", 1)[1])

    def world_size(self) -> int:
        return int(os.environ["MYSCHED_WORLD"])

    def global_rank(self) -> int:
        return int(os.environ["MYSCHED_RANK"])

    def local_rank(self) -> int:
        return int(os.environ["MYSCHED_LOCAL_RANK"])

    def node_rank(self) -> int:
        return int(os.environ["MYSCHED_NODE"])

    def validate(self, devices: int, num_nodes: int) -> None:
        missing = [key for key in VARIABLES if key not in os.environ]
        if missing:
            raise ConfigError(f"cluster=mysched, but {', '.join(missing)} is not set: start the processes with "
                              "mysched (or choose cluster=auto).")
        if self.world_size() != devices * num_nodes:
            raise ConfigError(f"devices={devices} x num_nodes={num_nodes} = {devices * num_nodes}, but mysched "
                              f"started MYSCHED_WORLD={self.world_size()} process(es); make them agree.")
