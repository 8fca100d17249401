"""The ClusterEnvironment base class."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable


class ClusterEnvironment(ABC):
    """Where a process learns its place in the world.

    `creates_processes_externally` is the launch decision: True when something outside
    (torchrun, srun, mpirun) already started every process, so `run` joins instead of launching.
    Rank methods are read in worker processes; before launch only `detect` and
    `creates_processes_externally` are used.
    """

    name: str = "base"

    @staticmethod
    @abstractmethod
    def detect() -> bool:
        """Whether the current process runs inside this environment."""

    @property
    @abstractmethod
    def creates_processes_externally(self) -> bool:
        """True when every process was started outside the framework."""

    @property
    @abstractmethod
    def main_address(self) -> str: ...

    @property
    @abstractmethod
    def main_port(self) -> int: ...

    @abstractmethod
    def world_size(self) -> int: ...

    @abstractmethod
    def global_rank(self) -> int: ...

    @abstractmethod
    def local_rank(self) -> int: ...

    @abstractmethod
    def node_rank(self) -> int: ...

    def validate(self, devices: int, num_nodes: int) -> None:
        """Raise a ConfigError if the environment disagrees with `devices`/`num_nodes`."""

    @property
    def restarted(self) -> bool:
        """True when the scheduler restarted this job (e.g. a requeued SLURM job): a run without
        `resume` or `ckpt_path` then continues from its newest checkpoint instead of refusing."""
        return False

    def preemption_signals(self) -> list[str]:
        """Signals this environment sends ahead of preemption, watched besides
        `trainer.preemption_signals`."""
        return []

    #: set by `on_preempted` when the scheduler will run the job again by itself
    requeued: bool = False

    def on_preempted(self, say: Callable[[str], None]) -> None:
        """Called on global rank zero once the preemption checkpoint is saved (e.g. to requeue the
        job); `say` tells the user a line. Say what is done before doing it: a requeue may stop
        this process at once (SLURM cancels the running step), and a line said after is lost."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
