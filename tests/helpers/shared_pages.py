"""A callback that records, per rank at fit start, how much of the process's anonymous memory is
shared with other processes (pages inherited from the process it was forked from), and how many
objects its garbage collector leaves alone (frozen before the fork)."""
import gc
import json
import os
from pathlib import Path

from framework.callbacks.base import Callback


def smaps_kib(field: str) -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


class SharedPages(Callback):
    def __init__(self, out_dir: str = "."):
        self.out_dir = out_dir

    def on_fit_start(self, loop) -> None:
        parent_maps = Path(f"/proc/{os.getppid()}/maps").read_text()
        record = {"shared_dirty_kib": smaps_kib("Shared_Dirty"), "anonymous_kib": smaps_kib("Anonymous"),
                  "parent_has_torch": "libtorch_cpu" in parent_maps, "frozen_objects": gc.get_freeze_count()}
        Path(self.out_dir, f"shared_rank{loop.strategy.global_rank}.json").write_text(json.dumps(record))
