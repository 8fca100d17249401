"""Run a command inside its own cgroup v1 memory group: the whole job's peak memory (every process
it starts, page cache it brings in included), optionally under a cap the kernel enforces (the job
is OOM-killed past it, exit code 137). Needs root and a writable cgroup v1 memory controller."""
from __future__ import annotations

import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup/memory")


def available() -> str | None:
    """None when memory groups can be made here, else why not."""
    if not (ROOT / "cgroup.procs").exists():
        return f"no cgroup v1 memory controller at {ROOT}"
    if not os.access(ROOT, os.W_OK):
        return f"{ROOT} is not writable (run as root)"
    return None


@dataclass
class Result:
    returncode: int
    peak_bytes: int  # memory.max_usage_in_bytes
    oom_killed: bool  # the kernel killed a process of the group for the cap
    seconds: float
    stderr: str


def run(command: list[str], cap_bytes: int | None = None, cwd: Path | None = None, timeout: float = 3600) -> Result:
    group = ROOT / f"framework-bench-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        if cap_bytes:
            (group / "memory.limit_in_bytes").write_text(str(int(cap_bytes)))
            swap = group / "memory.memsw.limit_in_bytes"  # no escape into swap, where the kernel allows setting it
            if swap.exists():
                try:
                    swap.write_text(str(int(cap_bytes)))
                except OSError:
                    pass
        procs = group / "cgroup.procs"
        started = time.time()
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                                preexec_fn=lambda: procs.write_text(str(os.getpid())))
        peak = int((group / "memory.max_usage_in_bytes").read_text())
        failcnt = int((group / "memory.failcnt").read_text())
        oom = "oom_kill " in (group / "memory.oom_control").read_text() and any(
            line.startswith("oom_kill ") and int(line.split()[1]) > 0
            for line in (group / "memory.oom_control").read_text().splitlines())
        return Result(result.returncode, peak, oom or (bool(cap_bytes) and failcnt > 0 and result.returncode != 0),
                      time.time() - started, result.stderr)
    finally:
        for _ in range(50):  # the group can be removed once its last process has gone
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
