"""The CheckpointIO base class."""
from __future__ import annotations

import os
import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any


class CheckpointIO(ABC):
    """Writes and reads one object (nested dicts of tensors and plain values) at a path.

    The checkpoint format (framework.checkpoint) decides what goes in which file; a CheckpointIO
    only moves bytes: `save`, `load`, `remove`, and `wait` (for writers that work in the
    background; a no-op for synchronous ones)."""

    name: str = "base"

    @abstractmethod
    def save(self, obj: Any, path: str | os.PathLike) -> None:
        """Write `obj` to `path` so that a crash leaves either the old file or the new one."""

    @abstractmethod
    def load(self, path: str | os.PathLike) -> Any:
        """Read what `save` wrote; raise CheckpointError for a missing or corrupt file.
        Never unpickles arbitrary objects."""

    def remove(self, path: str | os.PathLike) -> None:
        p = Path(path)
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()

    #: whether `save` may return before the bytes are written (the loop then finalizes later)
    is_async: bool = False

    #: whether the model and optimizer state go to `save_sharded` (every rank writing its shards)
    #: instead of one `save` of the full state from rank zero
    sharded: bool = False

    def save_sharded(self, state: dict[str, Any], path: str | os.PathLike) -> None:
        """Collective: write the state every rank holds (its shards) into the directory `path`;
        read back by framework.checkpoint_io.dcp_reader. Only for CheckpointIOs with `sharded = True`."""
        raise TypeError(f"{type(self).__name__} writes whole files (sharded = False), not shards")

    def wait(self) -> None:
        """Block until every pending write is durable; raise the first error a write hit."""

    def discard(self) -> None:
        """After a failed checkpoint: let the writes still pending finish or fail, and forget
        their errors (the checkpoint they belonged to is being removed)."""
        try:
            self.wait()
        except Exception:  # noqa: BLE001 - already reported through the first error
            pass

    def close(self) -> None:
        """Wait for pending writes, then free what the writer keeps between saves (buffers, threads)."""
        self.wait()

    def pending(self) -> bool:
        """Whether a write is still in progress. A failed write counts as finished: `wait` raises
        its error, on every rank together (framework/checkpoint/format.py)."""
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
