"""A user's callback that stamps the clock at the end of every optimizer step (benchmarks/step_overhead.py)."""
from __future__ import annotations

import time

from framework.callbacks.base import Callback


class StepTimer(Callback):
    stamps: list[float] = []

    def on_fit_start(self, loop) -> None:
        StepTimer.stamps.append(time.perf_counter())

    def on_train_step_end(self, loop) -> None:
        StepTimer.stamps.append(time.perf_counter())
