"""A user's callback that stamps the clock at the end of every optimizer step (benchmarks/step_overhead.py)."""
from __future__ import annotations

import json
import time

import torch

from framework.callbacks.base import Callback


class StepTimer(Callback):
    stamps: list[float] = []

    def on_fit_start(self, loop) -> None:
        StepTimer.stamps.append(time.perf_counter())

    def on_train_step_end(self, loop) -> None:
        StepTimer.stamps.append(time.perf_counter())


class SyncClock(Callback):
    """A synchronised clock around steps `first`..`last` (the device's queued work finished at
    both ends): what benchmarks/gpu_check.py holds the throughput meter against. Writes
    clock.json into the run's folder."""

    def __init__(self, first: int, last: int):
        self.first, self.last, self.stamps = first, last, {}

    def on_train_step_end(self, loop) -> None:
        step = loop.state.step
        if step in (self.first, self.last):
            torch.cuda.synchronize() if torch.cuda.is_available() else None
            self.stamps[step] = time.perf_counter()
        if step == self.last and loop.strategy.is_global_zero:
            seconds = self.stamps[self.last] - self.stamps[self.first]
            (loop.output_dir / "clock.json").write_text(json.dumps({"steps": self.last - self.first,
                                                                    "seconds": seconds}))
