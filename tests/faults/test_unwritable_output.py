"""An output directory that cannot be written (a read-only file system, as root sees one) is
refused before training: exit 2, one paragraph, no traceback, nothing written."""
from __future__ import annotations

import pytest

from framework.errors import ExitCode
from tests.conftest import DIGITS, run_train
from tests.helpers.tmpfs import tmpfs


@pytest.fixture
def read_only_disk(tmp_path):
    with tmpfs(tmp_path / "ro", "ro,size=1m") as mount:
        yield mount


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
