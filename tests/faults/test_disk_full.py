"""A disk that fills up while a checkpoint is written: one paragraph naming the fault, what the
checkpoint needs and what is free; the partial directory removed; every complete checkpoint
intact; exit code 74; and after space is freed, resume=auto ends bit-identical to an undisturbed
run (the session's, tests/helpers/run_cache.py). The same with the background writers (async,
dcp) and with 2 processes."""
from __future__ import annotations

import subprocess

import pytest

from framework.checkpoint.format import check_files, list_checkpoints, read_meta
from framework.errors import ExitCode
from tests.conftest import DIGITS, assert_state_equal, load_model_state, load_optimizer_state, run_train
from tests.helpers.in_process import run_command
from tests.helpers.run_cache import trained_run
from tests.helpers.tmpfs import tmpfs

RUN = [*DIGITS, "trainer.max_steps=10", "trainer.val_every=100", "callbacks.checkpoint.every_n_steps=2",
       "callbacks.checkpoint.keep_last_k=10"]


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs: the run's files and two checkpoints fit, the third does not."""
    with tmpfs(tmp_path / "disk", "size=1m") as mount:
        yield mount


@pytest.mark.slow
@pytest.mark.parametrize("variant", [["checkpoint_io=torch"], ["checkpoint_io=async"],
                                     ["checkpoint_io=dcp", "checkpoint_io.async_save=true", "strategy=ddp",
                                      "devices=2"]],
                         ids=["torch", "async", "dcp-async-2-processes"])
def test_a_full_disk_loses_nothing_says_why_and_resumes_exactly(small_disk, tmp_path, variant):
    run_dir = small_disk / "run"
    full = run_train([*RUN, *variant, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert full.returncode == ExitCode.STORAGE, (full.returncode, full.stdout[-2000:], full.stderr[-3000:])
    message = full.stderr.strip().splitlines()
    assert message[0].startswith("storage error: the disk is full: checkpoint step_000006 did not fit in"), full.stderr
    assert "were left when the write failed; a checkpoint needs about" in message[0]
    assert "the size of step_000004" in message[0]
    assert "step_000004 is the newest complete checkpoint" in message[0] and "keep_last_k=1" in message[0]
    assert "Traceback" not in full.stderr + full.stdout
    complete, partial = list_checkpoints(run_dir / "checkpoints")
    assert [c.step for c in complete] == [2, 4] and partial == []  # the partial one holds no space
    for c in complete:
        meta = read_meta(c.path)
        check_files(c.path, meta, list(meta["files"]))

    subprocess.run(["mount", "-o", "remount,size=16m", str(small_disk)], check=True)  # space freed
    # the resume through the command's own entry in this process (the failure above is the real
    # command's exit); the undisturbed run is the session's (checkpoint_io does not touch the math)
    resumed = run_command(["train", *RUN, *variant, f"hydra.run.dir={run_dir}", "resume=auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    straight = trained_run([*RUN, *[o for o in variant if o.startswith(("strategy=", "devices="))]])
    a, b = run_dir / "checkpoints" / "step_000010", straight / "checkpoints" / "step_000010"
    assert_state_equal(load_model_state(a), load_model_state(b), "model")
    assert_state_equal(load_optimizer_state(a), load_optimizer_state(b), "optimizer")
