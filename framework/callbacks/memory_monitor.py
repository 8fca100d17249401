"""`callbacks=[...,memory_monitor]`: peak memory per rank, logged and written to memory.json."""
from __future__ import annotations

import ctypes
import gc
import json
import os
import resource
import sys
from pathlib import Path

import torch

from framework.callbacks.base import Callback
from framework.cgroup import memory_groups

_STATUS = Path("/proc/self/status")


def _status_bytes(field: str) -> int | None:
    """A memory field of /proc/self/status (Linux) in bytes, e.g. VmRSS or VmHWM (peak RSS)."""
    if not _STATUS.exists():
        return None
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return None


def resident_bytes() -> int:
    current = _status_bytes("VmRSS")
    return current if current is not None else peak_resident_bytes()


def peak_resident_bytes() -> int:
    peak = _status_bytes("VmHWM")
    if peak is not None:
        return peak
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024


def release_free_memory() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them otherwise), so resident memory
    shows what is live, not what set-up once used (e.g. the full model before sharding)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def reset_peak_resident() -> bool:
    """Restart the peak-RSS high-water mark (Linux >= 4.0); False where that is impossible."""
    release_free_memory()
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class OwnMemoryGroup:
    """This process's cgroup v1 memory group, when the process is alone in it (a per-process cap:
    a scheduler's per-task group, or benchmarks/cgroup.py's per-worker one). The group's charge
    counts the pages this process brought in or copied itself (a page shared with its parent that
    it writes becomes its own), and is what a cap on the group is enforced against; resident
    memory (RSS) also counts the pages it shares, e.g. library code a forked worker maps after its
    parent loaded it, and does not grow when it copies one. Processes it starts later (data loader
    workers) join the group and are counted with it. `find()` is None anywhere else (a shared
    group, cgroup v2)."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def find(cls) -> OwnMemoryGroup | None:
        group = next((g for g in memory_groups() if g.version == 1), None)
        if group is None or group.name == "/":
            return None
        try:
            alone = (group.path / "cgroup.procs").read_text().split() == [str(os.getpid())]
        except OSError:
            return None
        return cls(group.path) if alone else None

    def _read(self, name: str) -> int:
        return int((self.path / name).read_text())

    def usage(self) -> int:
        return self._read("memory.usage_in_bytes")

    def peak(self) -> int:
        return self._read("memory.max_usage_in_bytes")

    def reset_peak(self) -> bool:
        try:
            (self.path / "memory.max_usage_in_bytes").write_text("0")
            return True
        except OSError:
            return False


class MemoryMonitor(Callback):
    """Per rank: the resident memory before the model was built (baseline: torch with the compiler
    stack its optimizers import, and the data), the
    peak while setting up (building and wrapping/sharding the model), and the peak while training
    (the high-water mark is reset once set-up is done, where the OS allows). A rank alone in a
    memory cgroup (OwnMemoryGroup) also gets the same three figures of its group's charge, its own
    memory: memory.json's `group_*_bytes` (-1 elsewhere). Logs
    `memory/train_peak_rss_mb` (largest over ranks; `memory/cuda_peak_mb` on CUDA) every log
    interval; rank zero writes everything to `<run dir>/memory.json` at the end."""

    def __init__(self):
        # every torch optimizer imports torch._dynamo (~70 MiB resident) when it is first used;
        # the launching process has already imported it (the pre-launch check's forward on the
        # meta device does), a fresh worker has not: import it here so that a baseline means the
        # same in every process
        import torch._dynamo  # noqa: F401

        self.baseline = resident_bytes()  # built before the model
        self.setup_peak = 0
        self.reset_ok = False
        self.group = OwnMemoryGroup.find()
        self.group_baseline = self.group.usage() if self.group else -1
        self.group_setup_peak = -1
        self.group_reset_ok = False

    def on_fit_start(self, loop) -> None:
        self.setup_peak = peak_resident_bytes()
        self.reset_ok = reset_peak_resident()
        if self.group:
            self.group_setup_peak = self.group.peak()
            self.group_reset_ok = self.group.reset_peak()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()

    def _gather(self, loop) -> torch.Tensor:
        cuda = torch.cuda.max_memory_allocated() if torch.cuda.is_available() and torch.cuda.is_initialized() else 0
        group_train_peak = self.group.peak() if self.group and self.group_reset_ok else -1
        mine = torch.tensor([self.baseline, self.setup_peak, peak_resident_bytes(), cuda, self.group_baseline,
                             self.group_setup_peak, group_train_peak], dtype=torch.float64,
                            device=loop.strategy.root_device)
        return loop.strategy.all_gather(mine)  # (world, 7)

    def on_train_step_end(self, loop) -> None:
        if loop.state.step % loop.trainer.log_every == 0:
            peaks = self._gather(loop)
            metrics = {"memory/train_peak_rss_mb": peaks[:, 2].max().item() / 2**20}
            if peaks[:, 3].max() > 0:
                metrics["memory/cuda_peak_mb"] = peaks[:, 3].max().item() / 2**20
            loop.log_metrics(metrics)

    def on_fit_end(self, loop) -> None:
        peaks = self._gather(loop).cpu().tolist()
        if loop.strategy.is_global_zero:
            ranks = [{"rank": r, "baseline_rss_bytes": int(p[0]), "setup_peak_rss_bytes": int(p[1]),
                      "train_peak_rss_bytes": int(p[2]), "cuda_peak_bytes": int(p[3]),
                      "group_baseline_bytes": int(p[4]), "group_setup_peak_bytes": int(p[5]),
                      "group_train_peak_bytes": int(p[6])} for r, p in enumerate(peaks)]
            (loop.output_dir / "memory.json").write_text(
                json.dumps({"train_peak_is_after_setup": self.reset_ok, "ranks": ranks}, indent=2))
