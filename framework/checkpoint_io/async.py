"""`checkpoint_io=async`: writes in a background thread; training waits only for the copy."""
from __future__ import annotations

import queue
import threading
from typing import Any

from framework.checkpoint_io.torch import TorchCheckpointIO
from framework.errors import CheckpointError
from framework.tensors import map_tensors


def snapshot(obj: Any) -> Any:
    """A deep copy of every tensor (moved to CPU memory), so training can change the live ones."""
    return map_tensors(obj, lambda t: t.detach().to("cpu", copy=True))


class AsyncCheckpointIO(TorchCheckpointIO):
    """`save` copies the tensors off the live parameters and returns; one background thread
    writes the files in order with the same atomic temp-fsync-rename as checkpoint_io=torch. The
    loop finalizes a checkpoint (meta.json, rename into place) at the first step boundary after
    every rank's writes are done; a second checkpoint, or the end of training, waits for the
    first. An error in the writer is raised in the training process at the next boundary."""

    name = "async"
    is_async = True

    def __init__(self, fsync: bool = True):
        """fsync: flush each file to disk before the rename."""
        super().__init__(fsync=fsync)
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _worker(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                obj, path = item
                if self._error is None:
                    super().save(obj, path)
            except BaseException as err:  # kept and raised in the training thread
                with self._lock:
                    self._error = self._error or err
            finally:
                self._queue.task_done()

    def save(self, obj: Any, path) -> None:
        self._raise_error()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._worker, name="checkpoint-writer", daemon=True)
            self._thread.start()
        self._queue.put((snapshot(obj), path))

    def pending(self) -> bool:
        with self._lock:
            if self._error is not None:
                return False  # finished, with the error `wait` raises
        return self._queue.unfinished_tasks > 0

    def wait(self) -> None:
        self._queue.join()
        self._raise_error()

    def _raise_error(self) -> None:
        with self._lock:
            err, self._error = self._error, None
        if err is not None:
            raise CheckpointError(f"the background checkpoint writer failed: {type(err).__name__}: {err}") from err
