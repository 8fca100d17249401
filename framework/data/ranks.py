"""A DataModule's one-off preparation in a multi-process run: the first process of each node
prepares (its progress said by rank zero) while the node's others wait, then every process opens
the result; all agree before training starts.

The waiting goes through the process group's key-value store, polled, with no time limit: a
preparation may take hours, longer than any collective's timeout (strategy.timeout_s), which
would otherwise kill the waiting ranks with a misleading "stopped answering". A failure on any
process is seen by all of them at once.
"""
from __future__ import annotations

import itertools
import time

import torch.distributed.distributed_c10d as c10d

from framework.errors import ConfigError

POLL_S = 0.5
_rounds = itertools.count()  # one set of keys per preparation in this process's run


def _prepare(datamodule, talk: bool) -> BaseException | None:
    """Run prepare_data (with progress lines where this process talks)."""
    try:
        datamodule.prepare_data(say=print if talk else None)
    except Exception as err:  # the others must not wait for a process that has given up
        return err
    return None


def _wait(store, keys: list[str]) -> list[str]:
    """Each key's value, once every key is set (polled; no time limit). Stops early, raising, when a
    process recorded a failure."""
    while not store.check(keys):
        if store.check(["data/failed"]):
            raise ConfigError(f"data: preparing the data failed on another process ({store.get('data/failed').decode()})")
        time.sleep(POLL_S)
    return [store.get(key).decode() for key in keys]


def prepare_once(datamodule, strategy) -> None:
    """Collective: prepare the data once per node (local rank 0 first), every rank after it."""
    talk = strategy.is_global_zero
    if strategy.world_size == 1:
        failure = _prepare(datamodule, talk)
        if failure is not None:
            raise failure
        return
    store = c10d._get_default_store()
    run = next(_rounds)
    node = strategy.global_rank - strategy.local_rank  # the node's first rank
    failure = None
    if strategy.local_rank == 0:
        failure = _prepare(datamodule, talk)
    else:
        _wait(store, [f"data/{run}/node{node}"])
    if failure is None and strategy.local_rank != 0:
        failure = _prepare(datamodule, False)  # opens what the node's first process prepared
    if failure is not None:
        store.set("data/failed", f"rank {strategy.global_rank}: {type(failure).__name__}: {failure}")
    if strategy.local_rank == 0:
        store.set(f"data/{run}/node{node}", "failed" if failure else "ok")
    store.set(f"data/{run}/rank{strategy.global_rank}", "failed" if failure else "ok")
    if failure is not None:
        raise failure
    _wait(store, [f"data/{run}/rank{r}" for r in range(strategy.world_size)])
