"""A small tmpfs mounted for a test (a full disk, a read-only disk), or the test skipped with why."""
from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(mount: Path, options: str):
    """Mount a tmpfs with `options` (e.g. "size=1m", "ro,size=1m") at `mount`; root only."""
    mount.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
