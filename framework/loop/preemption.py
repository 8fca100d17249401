"""Stop cleanly when the scheduler asks: save at the next step boundary, exit with ExitCode.PREEMPTED.

A cluster scheduler announces preemption or the end of a time limit with a signal (SLURM sends
SIGTERM, or SIGUSR1 with `--signal=USR1@90`). The run finishes the step it is in, writes a
checkpoint, and exits with code 75 (EX_TEMPFAIL: "try again"), so a job script can requeue it;
the next `resume=auto` continues exactly where it stopped.
"""
from __future__ import annotations

import signal
import threading

from framework.errors import ExitCode
from framework.signals import signal_number


class PreemptionWatcher:
    """Installs handlers for `signals` (main thread only) that record the first one received."""

    def __init__(self, signals: list[str]):
        self.received: str | None = None
        self._previous: dict[signal.Signals, object] = {}
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be installed from the main thread
        for name in signals:
            number = signal_number(name)
            self._previous[number] = signal.signal(number, self._handle)

    @property
    def watching(self) -> bool:
        return bool(self._previous)

    def _handle(self, number, frame) -> None:
        self.received = self.received or signal.Signals(number).name

    def restore(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()


class Preempted(Exception):
    """Raised in the launching process when the run stopped for a signal after saving."""

    def __init__(self, signal_name: str, step: int | None, requeued: bool = False):
        self.signal_name, self.step = signal_name, step
        where = f" after saving a checkpoint at step {step}" if step is not None else ""
        then = ("the job was requeued and continues from it by itself" if requeued
                else "run the same command with resume=auto to continue")
        super().__init__(f"stopped by {signal_name}{where}; {then} (exit code {int(ExitCode.PREEMPTED)})")
