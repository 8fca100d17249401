"""The launching process's share of a preemption: pass the signal on to the workers, and let them
save and return.

torch's elastic agent turns SIGTERM, SIGINT, SIGHUP and SIGQUIT into a shutdown: it signals the
workers, joins them for 30 s, then SIGKILLs them and never reads what they returned. A worker that
saved at its next step boundary and returned then waited out those 30 s (a checkpoint slower than
that was killed mid-write), and the run could not say at which step it stopped. So the preemption
signals (trainer.preemption_signals) are taken from the agent (LaunchConfig.signals_to_handle, where
the installed torch has it; older versions keep all four and their 30 s wait):
the first one is passed on to every worker, which saves and returns as a finished run does. A
second one, or one before any worker has started, stops the workers at once, as the agent would.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

from torch.distributed.elastic.multiprocessing.api import SignalException

from framework.signals import signal_number

#: the signals torch's elastic agent turns into a shutdown of its workers (by default)
AGENT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


class SignalForwarder:
    """Installed in the launching process around the elastic launch; `pid_dir` holds a `pid<rank>`
    file per worker (written when it starts)."""

    def __init__(self, names: list[str], pid_dir: Path):
        self.pid_dir = pid_dir
        self._previous: dict[signal.Signals, object] = {}
        self._received: set[signal.Signals] = set()
        for name in names:
            number = signal_number(name)
            if number not in self._previous:
                self._previous[number] = signal.signal(number, self._forward)

    @staticmethod
    def left_to_agent(names: list[str]) -> str:
        """The signals the agent is left to handle (LaunchConfig.signals_to_handle)."""
        taken = {signal_number(name) for name in names}
        return ",".join(name for name in AGENT_SIGNALS if signal_number(name) not in taken)

    def worker_pids(self) -> list[int]:
        pids = []
        for pid_file in self.pid_dir.glob("pid*"):
            try:
                pids.append(int(pid_file.read_text()))
            except (OSError, ValueError):  # being written
                pass
        return pids

    def _forward(self, number, frame) -> None:
        number = signal.Signals(number)
        pids = self.worker_pids()
        if number.name in AGENT_SIGNALS and (number in self._received or not pids):
            # what the agent's own handler raises: it stops the workers (SIGTERM, then SIGKILL)
            raise SignalException(f"Process {os.getpid()} got signal: {number}", sigval=number)
        self._received.add(number)
        for pid in pids:
            try:
                os.kill(pid, number)
            except OSError:  # already gone
                pass

    def restore(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()
