"""A cgroup v1 memory group for one test's processes (as root), skipped with the reason where
none can be made; every process left in it is killed and the group removed afterwards."""
from __future__ import annotations

import os
import subprocess
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

MEMORY = Path("/sys/fs/cgroup/memory")


@contextmanager
def memory_group(limit_bytes: int | None = None):
    group = MEMORY / f"framework-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    try:
        group.mkdir()
        if limit_bytes:
            (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
    except OSError as err:
        pytest.skip(f"no writable cgroup v1 memory controller here (needs root): {err}")
    try:
        yield group
    finally:
        for _ in range(50):  # the group goes once the last process left in it has exited
            for pid in (group / "cgroup.procs").read_text().split():
                subprocess.run(["kill", "-9", pid], capture_output=True)
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def run_in_group(group: Path, command: str, **kwargs) -> subprocess.CompletedProcess:
    """`command` (a shell line) run with its shell, and what it execs, alone in `group`."""
    return subprocess.run(["sh", "-c", f"echo $$ > {group}/cgroup.procs && exec {command}"], capture_output=True,
                          text=True, **kwargs)
