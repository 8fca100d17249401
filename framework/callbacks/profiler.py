"""`callbacks=[...,profiler]`: torch.profiler over chosen training steps.

Steps are chosen with torch.profiler's schedule: `skip_first` steps ignored, then cycles of
`wait` idle steps, `warmup` steps traced but discarded (the profiler's own start-up), and
`active` steps recorded; `repeat` cycles. Each recorded cycle writes a trace to
`<run dir>/profiler/` (`rank<r>.<time>.pt.trace.json`: Perfetto, chrome://tracing and
TensorBoard's profiler plugin open it), and when fit ends the operations that took the most time
are printed as a table and written to `profiler/top_ops_rank<r>.txt`. On CUDA, with
`memory_snapshot`, the allocator's history is recorded too and dumped to
`profiler/memory_snapshot_rank<r>.pickle` (open it at pytorch.org/memory_viz).
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from framework.callbacks.base import Callback
from framework.config.types import NonNegativeInt, PositiveInt
from framework.errors import ConfigError

SORT_KEYS = ("self_cpu_time_total", "cpu_time_total", "self_cuda_time_total", "cuda_time_total",
             "self_cpu_memory_usage", "cpu_memory_usage", "self_cuda_memory_usage", "count")
DIRECTORY = "profiler"


class Profiler(Callback):
    def __init__(self, skip_first: NonNegativeInt = 1, wait: NonNegativeInt = 0, warmup: NonNegativeInt = 1,
                 active: PositiveInt = 3, repeat: PositiveInt = 1, ranks: list[int] | None = None,
                 record_shapes: bool = False, profile_memory: bool = True, with_stack: bool = False,
                 sort_by: str = "self_cpu_time_total", row_limit: PositiveInt = 15, memory_snapshot: bool = False):
        """skip_first: steps not profiled at the start; wait / warmup / active: each cycle's idle,
        discarded and recorded steps; repeat: cycles; ranks: the ranks that profile (null: rank
        0); record_shapes: record the input shapes of each operation; profile_memory: memory each
        operation allocates; with_stack: the Python stack of each operation (larger traces);
        sort_by: the column that ranks the table (self_cpu_time_total, cuda_time_total, ...);
        row_limit: rows of the table; memory_snapshot: on CUDA, record the allocator's history."""
        if sort_by not in SORT_KEYS:
            raise ConfigError(f"callbacks.profiler.sort_by={sort_by!r}: choose one of {', '.join(SORT_KEYS)}.")
        self.steps = {"skip_first": skip_first, "wait": wait, "warmup": warmup, "active": active, "repeat": repeat}
        self.ranks = [0] if ranks is None else list(ranks)
        self.options = {"record_shapes": record_shapes, "profile_memory": profile_memory, "with_stack": with_stack}
        self.sort_by, self.row_limit, self.memory_snapshot = sort_by, row_limit, memory_snapshot
        self._profile = None
        self._directory: Path | None = None
        self._rank = 0

    def on_fit_start(self, loop) -> None:
        self._rank = loop.strategy.global_rank
        if self._rank not in self.ranks:
            return
        self._directory = Path(loop.output_dir) / DIRECTORY
        self._directory.mkdir(parents=True, exist_ok=True)
        cuda = loop.strategy.root_device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self._profile = profile(activities=activities, schedule=schedule(**self.steps),
                                on_trace_ready=tensorboard_trace_handler(str(self._directory), f"rank{self._rank}"),
                                **self.options)
        if self.memory_snapshot and cuda:
            torch.cuda.memory._record_memory_history(max_entries=100_000)
        self._profile.start()
        loop.say(f"profiler: steps {self._first_step() + 1}-{self._first_step() + self.steps['active']} recorded "
                 f"(x{self.steps['repeat']}), traces in {self._directory}")

    def _first_step(self) -> int:
        return self.steps["skip_first"] + self.steps["wait"] + self.steps["warmup"]

    def on_train_step_end(self, loop) -> None:
        if self._profile is not None:
            self._profile.step()

    def on_fit_end(self, loop) -> None:
        if self._profile is None:
            return
        self._profile.stop()
        table = self._table()
        if table:
            (self._directory / f"top_ops_rank{self._rank}.txt").write_text(table + "\n")
            print(f"profiler, rank {self._rank}: the operations that took the most time ({self.sort_by})\n{table}",
                  flush=True)
        else:
            loop.say(f"profiler: no step was recorded (the run took {loop.state.step} steps; the schedule records "
                     f"from step {self._first_step() + 1}); lower callbacks.profiler.skip_first / wait / warmup")
        if self.memory_snapshot and torch.cuda.is_available():
            torch.cuda.memory._dump_snapshot(str(self._directory / f"memory_snapshot_rank{self._rank}.pickle"))
            torch.cuda.memory._record_memory_history(enabled=None)
        self._profile = None

    def _table(self) -> str:
        try:
            averages = self._profile.key_averages()
        except (AssertionError, RuntimeError):  # nothing was recorded
            return ""
        if not len(averages):
            return ""
        return averages.table(sort_by=self.sort_by, row_limit=self.row_limit)
