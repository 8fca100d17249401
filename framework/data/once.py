"""Data is prepared once: one mechanism, at the two scopes where processes meet.

- A folder's preparation is exclusive (`folder_lock`): a lock file beside it, held while it is
  checked and (re)prepared, so every process that shares the folder (another run, another node on
  a shared file system, `framework prepare-data` beside a run) waits, then finds it ready.
- A run's processes take their turns (`prepare_once`): the first process of each node prepares
  (its progress said by rank zero) while the node's others wait, then every process opens the
  result; all agree before training starts. The waiting goes through the process group's
  key-value store, polled, with no time limit: a preparation may take hours, longer than any
  collective's timeout (strategy.timeout_s), which would otherwise kill the waiting ranks with a
  misleading "stopped answering". A failure on any process is seen by all of them at once.
"""
from __future__ import annotations

import fcntl
import itertools
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch.distributed.distributed_c10d as c10d

from framework.errors import ConfigError


@contextmanager
def folder_lock(directory: Path, say: Callable[[str], None]) -> Iterator[None]:
    """An exclusive lock beside `directory`, held while it is checked and (re)prepared: every
    process sharing the folder (other runs, other nodes on a shared file system) waits, then finds
    it ready. Says who holds it while waiting."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    path = directory.with_name(directory.name + ".lock")
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            say(f"data: {holder} is preparing this data ({directory}); waiting for it (no time limit)")
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{socket.gethostname()} pid {os.getpid()}")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
