"""A callback that stops its own process (SIGSTOP) on one rank at one step: a hung rank."""
import os
import signal
from pathlib import Path

from framework.callbacks.base import Callback


class StopRank(Callback):
    """On `rank`, after step `at_step`, in the first attempt only (a restarted group runs on), write
    the pid to `pid_file` and stop."""

    def __init__(self, rank: int = 1, at_step: int = 3, pid_file: str = "stopped.pid"):
        self.rank, self.at_step, self.pid_file = rank, at_step, pid_file

    def on_train_step_end(self, loop) -> None:
        if (loop.strategy.global_rank == self.rank and loop.state.step == self.at_step
                and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"):
            Path(self.pid_file).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)
