"""`cluster=auto`: the first environment in DETECTION_ORDER that recognises this process."""
from __future__ import annotations

from framework.cluster.base import ClusterEnvironment
from framework.cluster.local import LocalEnvironment

# Scheduler environments (torchelastic, slurm, lsf, mpi) are added ahead of `local` as they land.
DETECTION_ORDER: list[type[ClusterEnvironment]] = [LocalEnvironment]


def auto_cluster() -> ClusterEnvironment:
    for cls in DETECTION_ORDER:
        if cls.detect():
            return cls()
    return LocalEnvironment()
