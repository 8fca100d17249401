"""A scheduler's environment as the job will have it, for `framework plan --device cuda ...` on a
login node: with cluster=slurm (or lsf, mpi, torchelastic, kubeflow), the job's processes are
started by the scheduler's launcher (srun, jsrun, mpirun, torchrun) on every node, which this
process outside any job cannot see. Everything else is the real environment's."""
from __future__ import annotations

from framework.cluster.base import ClusterEnvironment


class PlannedCluster:
    """Stands in for `real` (a SLURMEnvironment, say) outside the job it describes."""

    def __init__(self, real: ClusterEnvironment):
        self.real = real

    @property
    def creates_processes_externally(self) -> bool:  # the job's launcher starts every process there
        return True

    def __getattr__(self, name: str):  # anything else is the environment's own
        return getattr(self.__dict__["real"], name)


def planned_cluster(cluster: ClusterEnvironment):
    """`cluster` as the job will have it (the local environment, which launches itself, as it is)."""
    return cluster if cluster.name == "local" or isinstance(cluster, PlannedCluster) else PlannedCluster(cluster)
