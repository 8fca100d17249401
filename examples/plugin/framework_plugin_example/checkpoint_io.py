"""`checkpoint_io=bucket`: checkpoints written locally (atomically, as checkpoint_io=torch does)
and mirrored to an fsspec URL: an object store, a network folder, memory:// in tests. A file
missing locally is read back from the bucket."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from framework.checkpoint_io.torch import TorchCheckpointIO


class BucketCheckpointIO(TorchCheckpointIO):
    """Every saved file is copied to `<url>/<its path relative to the working directory>`. The
    framework writes a checkpoint into `.partial-<name>/` and renames it when complete; the mirror
    stores each file under the final `<name>/` (the local directory, with its meta.json, stays
    the record of which checkpoints are complete)."""

    name = "bucket"
    requires_packages = {"fsspec": "fsspec"}

    def __init__(self, url: str = "memory://checkpoints", fsync: bool = True):
        """url: where the mirror lives (any fsspec URL, e.g. file:///mnt/bucket, s3://bucket/runs);
        fsync: flush local files before their rename."""
        super().__init__(fsync=fsync)
        self.url = url.rstrip("/")

    def remote_path(self, path) -> str:
        path = Path(os.path.abspath(path))
        try:
            relative = path.relative_to(Path.cwd())
        except ValueError:
            relative = Path(*path.parts[1:])
        parts = [part.removeprefix(".partial-") for part in relative.parts]
        return f"{self.url}/{'/'.join(parts)}"

    def _fs(self):
        import fsspec

        fs, _ = fsspec.core.url_to_fs(self.url)
        return fs

    def save(self, obj: Any, path) -> None:
        super().save(obj, path)
        fs = self._fs()
        remote = self.remote_path(path)
        fs.makedirs(remote.rsplit("/", 1)[0], exist_ok=True)
        fs.put_file(str(path), remote)

    def load(self, path) -> Any:
        if not Path(path).is_file():
            fs = self._fs()
            remote = self.remote_path(path)
            if fs.exists(remote):
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                fs.get_file(remote, str(path))
        return super().load(path)

    def remove(self, path) -> None:
        super().remove(path)
        fs = self._fs()
        remote = self.remote_path(path)
        if fs.exists(remote):
            fs.rm(remote, recursive=True)
