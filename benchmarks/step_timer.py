"""Users' callbacks that time optimizer steps: benchmarks/step_overhead.py (InterleavedTimer) and
benchmarks/gpu_check.py (SyncClock)."""
from __future__ import annotations

import json
import time

import torch

from framework.callbacks.base import Callback


class InterleavedTimer(Callback):
    """Times the framework's steps and, after every `block` of them, runs the next `block` steps of
    a hand-written loop (`raw`, a generator yielding after each step) in the same process, timing
    those too: the two loops take turns every fraction of a second, so a machine whose speed drifts
    slows both alike. A framework step's time runs from the end of the previous one (or of the raw
    block that followed it) to the end of this one, so the raw steps are never counted in it."""

    raw = None  # the hand-written loop's generator, set by the benchmark before the run
    block = 100
    framework: list[float] = []
    hand_written: list[float] = []

    def on_fit_start(self, loop) -> None:
        self._last = time.perf_counter()

    def on_train_step_end(self, loop) -> None:
        now = time.perf_counter()
        InterleavedTimer.framework.append(now - self._last)
        if len(InterleavedTimer.framework) % self.block == 0:
            for _ in range(self.block):
                start = time.perf_counter()
                next(self.raw)
                InterleavedTimer.hand_written.append(time.perf_counter() - start)
        self._last = time.perf_counter()


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
