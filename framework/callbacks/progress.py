"""Progress output on rank zero: a live rich bar on a terminal, plain lines otherwise.

Not a config group: `trainer.progress_bar` chooses, and the bar is off automatically when
stdout is not a terminal (logs, CI), where `TextProgress` prints a line every log interval.
"""
from __future__ import annotations

import sys

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from framework.callbacks.base import Callback


def format_metrics(metrics: dict[str, float], prefix: str) -> str:
    return "  ".join(f"{k} {v:.4g}" for k, v in metrics.items() if k.startswith(prefix))


class TextProgress(Callback):
    """Prints `step N/M | train/loss ... | tokens/s ...` every log interval and every validation."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stdout

    def on_metrics(self, loop, metrics) -> None:
        if any(k.startswith("train/") for k in metrics):
            total = f"/{loop.trainer.max_steps}" if loop.trainer.max_steps else ""
            print(f"step {loop.state.step}{total} | {format_metrics(metrics, 'train/')}",
                  file=self.stream, flush=True)

    def on_validation_end(self, loop, metrics) -> None:
        print(f"step {loop.state.step} | {format_metrics(metrics, 'val/')}", file=self.stream, flush=True)


class RichProgress(Callback):
    """A live bar with step count, loss and throughput; validation results print above it."""

    def on_fit_start(self, loop) -> None:
        self.progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                 TimeRemainingColumn(), TextColumn("{task.fields[info]}"), transient=False)
        self.progress.start()
        self.task = self.progress.add_task("train", total=loop.trainer.max_steps, completed=loop.state.step,
                                           info="")

    def on_train_step_end(self, loop) -> None:
        info = format_metrics(loop.state.metrics, "train/") if loop.state.step % loop.trainer.log_every == 0 else None
        self.progress.update(self.task, completed=loop.state.step, **({"info": info} if info is not None else {}))

    def on_validation_end(self, loop, metrics) -> None:
        self.progress.console.print(f"step {loop.state.step} | {format_metrics(metrics, 'val/')}")

    def on_fit_end(self, loop) -> None:
        self.progress.stop()
