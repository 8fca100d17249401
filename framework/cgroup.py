"""This process's memory cgroup, read from /proc/self/cgroup: the one reader behind the OOM-kill
report (framework/launch/oom.py) and the own-memory figures (framework/callbacks/memory_monitor.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class MemoryGroup:
    path: Path
    """The group's directory under /sys/fs/cgroup."""
    version: int
    """1 (the memory controller's own hierarchy) or 2 (the unified hierarchy)."""
    name: str
    """The group's path inside its hierarchy ("/" for the root group)."""


def memory_groups(proc_cgroup: Path = Path("/proc/self/cgroup")) -> list[MemoryGroup]:
    """The memory cgroups this process is in: v2 and/or v1 (empty where /proc says nothing)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        _, controllers, name = line.split(":", 2)
        if controllers == "":  # cgroup v2 (unified)
            found.append(MemoryGroup(CGROUP_ROOT / name.lstrip("/"), 2, name))
        elif "memory" in controllers.split(","):  # cgroup v1
            found.append(MemoryGroup(CGROUP_ROOT / "memory" / name.lstrip("/"), 1, name))
    return found
