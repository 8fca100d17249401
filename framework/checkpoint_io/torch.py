"""`checkpoint_io=torch`: atomic torch.save (temp file, fsync, rename) and weights_only loads."""
from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from framework.checkpoint_io.base import CheckpointIO
from framework.errors import CheckpointError


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class TorchCheckpointIO(CheckpointIO):
    """One file per object. A write goes to a temporary file in the same directory, is fsynced,
    then renamed over the target, so a crash at any moment leaves the previous file intact."""

    name = "torch"

    def __init__(self, fsync: bool = True):
        """fsync: flush each file to disk before the rename (turn off only on throwaway storage)."""
        self.fsync = fsync

    def save(self, obj: Any, path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                torch.save(obj, f)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        if self.fsync:
            fsync_dir(path.parent)

    def load(self, path) -> Any:
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"checkpoint file {path} does not exist.")
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as err:
            raise CheckpointError(
                f"{path} holds objects other than tensors and plain values (for example a pickled "
                f"class or function), which are refused because loading them could run code: {err}"
            ) from err
        except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError) as err:
            raise CheckpointError(
                f"{path} is truncated or corrupt ({os.path.getsize(path)} bytes; torch says: "
                f"{str(err).splitlines()[0]}). Use an earlier checkpoint."
            ) from err
