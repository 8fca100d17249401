"""`callbacks=[...,early_stopping]`: stop when a validation metric stops improving."""
from __future__ import annotations

import math
from typing import Literal

from framework.callbacks.base import Callback
from framework.config.types import NonNegativeFloat, PositiveInt
from framework.errors import ConfigError


class EarlyStopping(Callback):
    """After `patience` validations without an improvement larger than `min_delta`, the run stops
    (at the end of that step; the final checkpoint and summary are still written)."""

    def __init__(self, monitor: str = "val/loss", mode: Literal["min", "max"] = "min",
                 patience: PositiveInt = 3, min_delta: NonNegativeFloat = 0.0):
        """monitor: a logged metric; mode: min or max is better; patience: validations to wait;
        min_delta: the smallest change that counts as an improvement."""
        self.monitor, self.mode, self.patience, self.min_delta = monitor, mode, patience, min_delta
        self.best = math.inf if mode == "min" else -math.inf
        self.wait = 0
        self.stopped_at: int | None = None

    def _improved(self, value: float) -> bool:
        return value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta

    def on_validation_end(self, loop, metrics) -> None:
        if self.monitor not in loop.state.metrics:
            raise ConfigError(f"callbacks.early_stopping.monitor={self.monitor!r} is not a logged metric; "
                              f"validation logs: {', '.join(sorted(metrics))}.")
        value = loop.state.metrics[self.monitor]
        if self._improved(value):
            self.best, self.wait = value, 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            self.stopped_at = loop.state.step
            loop.state.should_stop = True
            loop.say(f"early stopping at step {loop.state.step}: {self.monitor} has not improved on "
                     f"{self.best:.4f} for {self.wait} validations")

    def state_dict(self) -> dict:
        return {"best": self.best, "wait": self.wait}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.wait = float(state["best"]), int(state["wait"])
