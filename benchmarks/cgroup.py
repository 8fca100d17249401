"""Run a command inside its own cgroup v1 memory group: the whole job's peak memory (every process
it starts, page cache it brings in included), optionally under a cap the kernel enforces (the job
is OOM-killed past it, exit code 137), or with each local worker under a cap of its own (each is
moved into a child group as it appears). Needs root and a writable cgroup v1 memory controller."""
from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
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
    worker_peaks: list[int] = field(default_factory=list)  # per worker group, with worker_cap_bytes


def _parent(pid: str) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return None


def _is_forkserver(pid: str) -> bool:
    try:
        return b"multiprocessing.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class WorkerGroups(threading.Thread):
    """Moves every process the job's forkserver forks (the framework's local workers) into a child
    group of its own capped at `cap_bytes`, within milliseconds of its start (before it builds a
    model): a per-process cap. Pages it shares with the forkserver stay charged to the job, as they
    are not the worker's own; so do the few it writes before the move where the kernel refuses to
    move charges with a process (memory.move_charge_at_immigrate, deprecated: refused here)."""

    def __init__(self, group: Path, cap_bytes: int):
        super().__init__(daemon=True)
        self.group, self.cap_bytes = group, cap_bytes
        self.children: list[Path] = []
        self.moved: set[str] = set()
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._watch()
        except BaseException as error:  # noqa: BLE001 - reported by cgroup.run, not lost in the thread
            self.error = error

    def _watch(self) -> None:
        while not self.done.is_set():
            for pid in (self.group / "cgroup.procs").read_text().split():
                if pid in self.moved:
                    continue
                parent = _parent(pid)
                if parent is None or not _is_forkserver(parent) or _is_forkserver(_parent(parent) or ""):
                    continue  # not a worker: the launcher, the forkserver itself or a worker's helper
                child = self.group / f"worker{len(self.children)}"
                child.mkdir()
                (child / "memory.limit_in_bytes").write_text(str(int(self.cap_bytes)))
                try:
                    (child / "memory.move_charge_at_immigrate").write_text("3")
                except OSError:
                    pass
                self.children.append(child)
                self.moved.add(pid)
                try:
                    (child / "cgroup.procs").write_text(pid)
                except OSError:
                    pass  # it has already exited
            time.sleep(0.01)

    def oom_killed(self) -> bool:
        return any(_oom_kills(child) for child in self.children)

    def peaks(self) -> list[int]:
        return [int((child / "memory.max_usage_in_bytes").read_text()) for child in self.children]

    def remove(self) -> None:
        for child in self.children:
            _remove(child)


def _oom_kills(group: Path) -> int:
    for line in (group / "memory.oom_control").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def _remove(group: Path) -> None:
    for _ in range(50):  # the group can be removed once its last process has gone
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.1)


def run(command: list[str], cap_bytes: int | None = None, cwd: Path | None = None, timeout: float = 3600,
        worker_cap_bytes: int | None = None) -> Result:
    """`cap_bytes` caps the whole job; `worker_cap_bytes` caps each local worker on its own (in a
    group of its own, whose charge its memory_monitor reports too)."""
    group = ROOT / f"framework-bench-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    workers = WorkerGroups(group, worker_cap_bytes) if worker_cap_bytes else None
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
        if workers:
            workers.start()
        started = time.time()
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                                preexec_fn=lambda: procs.write_text(str(os.getpid())))
        if workers:
            workers.done.set()
            workers.join()
            if workers.error:
                raise RuntimeError("moving the workers into groups of their own failed") from workers.error
        peak = int((group / "memory.max_usage_in_bytes").read_text())  # child groups' usage included
        failcnt = int((group / "memory.failcnt").read_text())
        oom = _oom_kills(group) > 0 or bool(workers and workers.oom_killed())
        return Result(result.returncode, peak, oom or (bool(cap_bytes) and failcnt > 0 and result.returncode != 0),
                      time.time() - started, result.stderr, workers.peaks() if workers else [])
    finally:
        if workers:
            workers.done.set()
            workers.remove()
        _remove(group)
