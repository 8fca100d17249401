"""`cluster=kubeflow`: a Kubeflow PyTorchJob, one process per pod."""
from __future__ import annotations

from framework.cluster.env_vars import EnvironmentVariablesCluster
from framework.errors import ConfigError


class KubeflowEnvironment(EnvironmentVariablesCluster):
    """The training operator starts one pod per replica and sets MASTER_ADDR, MASTER_PORT,
    WORLD_SIZE (the number of pods) and RANK (this pod). Each pod runs one process, so a pod is a
    node: local rank 0, node rank = RANK. Never auto-detected: these variables look exactly like a
    plain torchrun's, so choose it with `cluster=kubeflow`."""

    name = "kubeflow"
    marker = "KUBERNETES_PORT"

    def validate(self, devices: int, num_nodes: int) -> None:
        missing = self.missing_variables()
        if missing:
            raise ConfigError(f"cluster=kubeflow, but {', '.join(missing)} is not set: this is not a pod of a "
                              "PyTorchJob (the training operator sets them).")
        if devices != 1:
            raise ConfigError(f"devices={devices} with cluster=kubeflow: a PyTorchJob runs one process per pod; "
                              "set devices=1 and scale with the job's replicas.")
        if self.world_size() != num_nodes:
            raise ConfigError(f"num_nodes={num_nodes}, but the PyTorchJob has {self.world_size()} pod(s) "
                              f"(WORLD_SIZE): set num_nodes={self.world_size()}.")
