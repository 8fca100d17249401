"""`cluster=torchelastic`: processes started by `torchrun` (torch's elastic agent)."""
from __future__ import annotations

import os

from framework.cluster.base import ClusterEnvironment
from framework.errors import ConfigError

REQUIRED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class TorchElasticEnvironment(ClusterEnvironment):
    """Every process was started by torchrun, on one node or several (`--nnodes`, c10d
    rendezvous): ranks from RANK, LOCAL_RANK, GROUP_RANK (the node), WORLD_SIZE; the process
    group joins the agent's store at MASTER_ADDR:MASTER_PORT."""

    name = "torchelastic"

    @staticmethod
    def detect() -> bool:
        return "TORCHELASTIC_RUN_ID" in os.environ and all(key in os.environ for key in REQUIRED)

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ["MASTER_ADDR"]

    @property
    def main_port(self) -> int:
        return int(os.environ["MASTER_PORT"])

    @property
    def restarted(self) -> bool:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0

    def world_size(self) -> int:
        return int(os.environ["WORLD_SIZE"])

    def global_rank(self) -> int:
        return int(os.environ["RANK"])

    def local_rank(self) -> int:
        return int(os.environ["LOCAL_RANK"])

    def node_rank(self) -> int:
        return int(os.environ.get("GROUP_RANK", 0))

    def validate(self, devices: int, num_nodes: int) -> None:
        missing = [key for key in REQUIRED if key not in os.environ]
        if missing:
            raise ConfigError(f"cluster=torchelastic, but {', '.join(missing)} is not set: start the run with "
                              "torchrun (or choose cluster=auto).")
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", devices))
        if per_node != devices:
            raise ConfigError(f"devices={devices}, but torchrun starts {per_node} process(es) per node "
                              f"(--nproc-per-node={per_node}): set devices={per_node}.")
        if self.world_size() != devices * num_nodes:
            nodes = self.world_size() // max(per_node, 1)
            raise ConfigError(f"num_nodes={num_nodes}, but torchrun's world is {self.world_size()} process(es), "
                              f"{per_node} per node, so {nodes} node(s): set num_nodes={nodes} "
                              f"(or torchrun --nnodes={num_nodes}).")
