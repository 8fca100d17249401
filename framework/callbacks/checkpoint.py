"""`callbacks=[checkpoint,...]`: save every N steps and at the end; keep the last k and best k."""
from __future__ import annotations

import shutil
from typing import Literal

from framework.callbacks.base import Callback
from framework.checkpoint.format import is_finite, list_checkpoints
from framework.checkpoint.load import best_checkpoint, monitored
from framework.config.types import NonNegativeInt, PositiveInt


class ModelCheckpoint(Callback):
    """Writes checkpoints to <run dir>/checkpoints and prunes old ones. A checkpoint survives if
    it is among the `keep_last_k` newest, or among the `best_k` best by `monitor` (its value at
    the time of saving, as recorded in its meta.json)."""

    def __init__(self, every_n_steps: PositiveInt | None = 100, save_last: bool = True,
                 keep_last_k: NonNegativeInt = 2, monitor: str | None = "val/loss",
                 mode: Literal["min", "max"] = "min", best_k: NonNegativeInt = 1):
        """every_n_steps: save every N optimizer steps (null: only at the end); save_last: save when
        training ends; keep_last_k: newest checkpoints kept (the newest complete one always is); monitor: metric that ranks checkpoints
        (null: rank none); mode: min or max is better; best_k: best checkpoints kept."""
        self.every_n_steps = every_n_steps
        self.save_last = save_last
        self.keep_last_k = keep_last_k
        self.monitor = monitor
        self.mode = mode
        self.best_k = best_k
        self.last_saved_step: int | None = None

    def on_train_step_end(self, loop) -> None:
        if self.every_n_steps and loop.state.step % self.every_n_steps == 0:
            self._save(loop)

    def on_fit_end(self, loop) -> None:
        if self.save_last and self.last_saved_step != loop.state.step:
            self._save(loop)

    def _save(self, loop) -> None:
        loop.save_checkpoint()
        self.last_saved_step = loop.state.step

    def on_checkpoint_saved(self, loop, path) -> None:
        if loop.strategy.is_global_zero:
            self.prune(loop.checkpoint_dir)
        loop.strategy.barrier()

    def _score(self, meta: dict) -> float | None:
        return monitored(meta, self.monitor)

    def prune(self, root) -> list:
        complete, _ = list_checkpoints(root)
        keep = {c.path for c in complete[-self.keep_last_k:]} if self.keep_last_k else set()
        scored = [c for c in complete if self._score(c.meta) is not None]
        scored.sort(key=lambda c: self._score(c.meta), reverse=self.mode == "max")
        keep |= {c.path for c in scored[: self.best_k]}
        if complete:  # whatever the settings, the newest complete checkpoint stays: a run can always resume
            keep.add(complete[-1].path)
        finite = [c for c in complete if is_finite(c.meta)]
        if finite:  # and so does the newest one of finite weights (a warn-policy run saves NaN ones too)
            keep.add(finite[-1].path)
        removed = [c.path for c in complete if c.path not in keep]
        for path in removed:
            try:
                shutil.rmtree(path)
            except FileNotFoundError:  # removed meanwhile by someone else: what pruning wanted anyway
                pass
        return removed

    def best(self, root):
        """The best complete checkpoint by `monitor`, or None."""
        return best_checkpoint(root, self.monitor, self.mode)

    def state_dict(self) -> dict:
        return {"last_saved_step": self.last_saved_step}

    def load_state_dict(self, state: dict) -> None:
        self.last_saved_step = state.get("last_saved_step")
