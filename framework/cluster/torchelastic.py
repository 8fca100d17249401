"""`cluster=torchelastic`: processes started by `torchrun` (torch's elastic agent)."""
from __future__ import annotations

import os

from framework.cluster.env_vars import EnvironmentVariablesCluster
from framework.errors import ConfigError


class TorchElasticEnvironment(EnvironmentVariablesCluster):
    """Every process was started by torchrun, on one node or several (`--nnodes`, c10d
    rendezvous): ranks from RANK, LOCAL_RANK, GROUP_RANK (the node), WORLD_SIZE; the process
    group joins the agent's store at MASTER_ADDR:MASTER_PORT."""

    name = "torchelastic"
    required = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    marker = "TORCHELASTIC_RUN_ID"
    local_rank_variable = "LOCAL_RANK"
    node_rank_variable = "GROUP_RANK"

    @property
    def restarted(self) -> bool:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0

    def validate(self, devices: int, num_nodes: int) -> None:
        missing = self.missing_variables()
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
