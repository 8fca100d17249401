"""An output directory that cannot be written (a read-only file system, as root sees one) is
refused before training: exit 2, one paragraph, no traceback, nothing written."""
from __future__ import annotations

import subprocess

import pytest

from framework.errors import ExitCode
from tests.conftest import DIGITS, run_train


@pytest.fixture
def read_only_disk(tmp_path):
    mount = tmp_path / "ro"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here (needs root): {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["run", "sweep"])
def test_a_read_only_output_directory_is_refused_before_training(read_only_disk, tmp_path, how):
    args = ([f"hydra.run.dir={read_only_disk}/run"] if how == "run"
            else ["-m", "optimizer.lr=0.01,0.02", f"hydra.sweep.dir={read_only_disk}/sweep"])
    result = run_train([*DIGITS, "trainer.max_steps=2", *args], cwd=tmp_path)
    assert result.returncode == ExitCode.USER_ERROR, (result.stdout[-2000:], result.stderr[-2000:])
    first = result.stderr.strip().splitlines()[0]
    key = "hydra.run.dir" if how == "run" else "hydra.sweep.dir"
    assert first.startswith(f"configuration error: {key}={read_only_disk}/") and "Read-only file system" in first
    assert "Traceback" not in result.stderr + result.stdout
    assert not any(read_only_disk.iterdir()) and not (tmp_path / "outputs").exists()
