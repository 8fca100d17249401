"""`cluster=local`: this machine; the framework starts the processes itself."""
from __future__ import annotations

import os

from framework.cluster.base import ClusterEnvironment


class LocalEnvironment(ClusterEnvironment):
    """One node. Ranks come from the variables the framework's own launcher sets in each worker
    (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); a lone process is rank 0 of 1."""

    name = "local"

    def __init__(self, main_address: str = "127.0.0.1", main_port: int = 0):
        """main_address / main_port: where rank 0 listens; port 0 picks a free port."""
        self._address = main_address
        self._port = main_port

    @staticmethod
    def detect() -> bool:
        return True

    @property
    def creates_processes_externally(self) -> bool:
        return False

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", self._address)

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", self._port))

    def world_size(self) -> int:
        return int(os.environ.get("WORLD_SIZE", 1))

    def global_rank(self) -> int:
        return int(os.environ.get("RANK", 0))

    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", 0))

    def node_rank(self) -> int:
        return int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", 0)))
