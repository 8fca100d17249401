"""Whether the kernel's out-of-memory killer ended a worker: the memory cgroup this process runs
in counts its OOM kills (cgroup v2 `memory.events`, cgroup v1 `memory.oom_control`), so a count
that grew while the workers ran, together with a worker killed by SIGKILL, names the cause."""
from __future__ import annotations

from pathlib import Path

from framework.cgroup import memory_groups

COUNTER_FILE = {2: "memory.events", 1: "memory.oom_control"}  # where each cgroup version counts OOM kills


def _counter(directory: Path, file: str) -> int | None:
    try:
        for line in (directory / file).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def _limit(directory: Path) -> int | None:
    for name in ("memory.max", "memory.limit_in_bytes"):
        try:
            text = (directory / name).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # "max" or a huge number: no limit
            return int(text)
    return None


class OomWatch:
    """Snapshot of the OOM-kill counters when the workers start; `kills()` tells how many the
    kernel made since, and `limit` the cgroup's memory limit (None: none, or not readable)."""

    def __init__(self):
        self._dirs = [(g.path, COUNTER_FILE[g.version]) for g in memory_groups()
                      if _counter(g.path, COUNTER_FILE[g.version]) is not None]
        self._start = {d: _counter(d, f) for d, f in self._dirs}
        self.limit = next((limit for d, _ in self._dirs if (limit := _limit(d)) is not None), None)

    def kills(self) -> int:
        return sum(max(0, (_counter(d, f) or 0) - self._start[d]) for d, f in self._dirs)
