"""`cluster=auto`: the first environment in DETECTION_ORDER that recognises this process."""
from __future__ import annotations

from framework.cluster.base import ClusterEnvironment
from framework.cluster.local import LocalEnvironment
from framework.cluster.lsf import LSFEnvironment
from framework.cluster.mpi import MPIEnvironment
from framework.cluster.slurm import SLURMEnvironment
from framework.cluster.torchelastic import TorchElasticEnvironment

# Kubeflow is not here: its variables are exactly a plain torchrun's (choose cluster=kubeflow).
DETECTION_ORDER: list[type[ClusterEnvironment]] = [TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment,
                                                   MPIEnvironment, LocalEnvironment]


def auto_cluster() -> ClusterEnvironment:
    for cls in DETECTION_ORDER:
        if cls.detect():
            return cls()
    return LocalEnvironment()
