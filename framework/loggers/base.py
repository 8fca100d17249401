"""The Logger base class. Loggers exist on rank zero only; the loop reduces metrics first."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Logger(ABC):
    """Receives hyper-parameters once (`log_hyperparams`), metrics as they come
    (`log_metrics(metrics, step)`), and `finalize()` at the end of the run."""

    def __init__(self, save_dir: str):
        self.save_dir = save_dir

    @abstractmethod
    def log_hyperparams(self, params: dict[str, Any]) -> None: ...

    @abstractmethod
    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def truncate(self, step: int) -> None:
        """Forget anything logged after `step` (a resumed run repeats those steps)."""

    def finalize(self) -> None:
        """Flush and close."""
