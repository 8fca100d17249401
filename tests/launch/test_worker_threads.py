"""How many torch threads each local worker gets: its share of the cores, capped by OMP_NUM_THREADS."""
from __future__ import annotations

import os

import pytest

from framework.launch.elastic import CORES_ENV, worker_threads


@pytest.mark.parametrize("cores,share,omp,nproc,threads", [
    (16, None, None, 4, 4),  # the node's cores shared by its workers
    (16, None, "1", 4, 1),  # OMP_NUM_THREADS caps them (the test suite runs one thread a process)
    (16, None, "8", 4, 4),  # a cap above the share does not oversubscribe the cores
    (16, "4", None, 2, 2),  # a replica group's share of the node (framework/launch/replica_groups.py)
    (2, None, None, 4, 1),  # never fewer than one
    (16, None, "4,2", 4, 4),  # OpenMP's nested form: not a number, no cap
])
def test_each_worker_takes_its_share_of_the_cores_at_most_omp_num_threads(monkeypatch, cores, share, omp, nproc,
                                                                         threads):
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    for key, value in ((CORES_ENV, share), ("OMP_NUM_THREADS", omp)):
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    assert worker_threads(nproc) == threads
