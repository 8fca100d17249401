"""Real runs killed at the worst moments: mid-write, and one rank of a running group."""
from __future__ import annotations

import pytest

from tests.conftest import ROOT, TINY_GPT, assert_state_equal, checkpoints, load_model_state, run_train
from tests.helpers.in_process import run_command
from tests.helpers.run_cache import trained_run

pytestmark = pytest.mark.slow

ARGS = [*TINY_GPT, "model.dropout=0.1", "trainer.val_every=4", "scheduler.total_steps=12",
        "callbacks.checkpoint.every_n_steps=3", "callbacks.checkpoint.keep_last_k=10"]
ENV = {"PYTHONPATH": str(ROOT), "FRAMEWORK_TRUST_ALLOW": "tests.helpers."}  # the fault injectors are test code


def test_sigkill_during_a_checkpoint_write_keeps_the_previous_one(tmp_path):
    """Each checkpoint writes 3 files (loop state, model, optimizer): the 5th save is the model of
    the second checkpoint (step 6)."""
    args = [*ARGS, "name=killed", "trainer.max_steps=12", "checkpoint_io._target_=tests.helpers.killer.DyingCheckpointIO",
            "+checkpoint_io.die_at_save=5"]
    died = run_train(args, tmp_path, env=ENV)
    assert died.returncode == -9
    run = tmp_path / "outputs" / "killed"
    assert [p.name for p in checkpoints(run)] == ["step_000003"]
    assert (run / "checkpoints" / ".partial-step_000006").is_dir()
    # the resume and the undisturbed run through the command's own entry in this process
    resumed = run_command(["train", *ARGS, "name=killed", "trainer.max_steps=12", "resume=auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "ignoring incomplete checkpoint" in resumed.stdout and "resumed from" in resumed.stdout
    assert "step_000003" in resumed.stdout
    straight = run_command(["train", *ARGS, "name=straight", "trainer.max_steps=12"], tmp_path)
    assert straight.returncode == 0
    assert_state_equal(load_model_state(checkpoints(run)[-1]),
                       load_model_state(checkpoints(tmp_path / "outputs" / "straight")[-1]))


def test_a_killed_worker_is_restarted_and_the_run_ends_as_if_undisturbed(tmp_path):
    base = [*ARGS, "strategy=ddp", "devices=2", "trainer.max_steps=12"]
    disturbed = run_train([*base, "name=disturbed", "trainer.max_restarts=1",
                           "+callbacks.killer._target_=tests.helpers.killer.KillRankOnce",
                           "+callbacks.killer.rank=1", "+callbacks.killer.step=7"], tmp_path, env=ENV)
    assert disturbed.returncode == 0, disturbed.stderr
    assert "resumed from" in disturbed.stdout and "step_000006" in disturbed.stdout
    a = checkpoints(tmp_path / "outputs" / "disturbed")[-1]
    b = checkpoints(trained_run(base))[-1]  # undisturbed (the workers' conditions are the launcher's either way)
    assert a.name == b.name == "step_000012"
    assert_state_equal(load_model_state(a), load_model_state(b))


def test_without_restarts_a_killed_worker_fails_the_run(tmp_path):
    result = run_train([*ARGS, "strategy=ddp", "devices=2", "trainer.max_steps=12", "name=dead",
                        "+callbacks.killer._target_=tests.helpers.killer.KillRankOnce"], tmp_path, env=ENV)
    assert result.returncode == 1
    assert result.stderr.startswith("error: worker rank 1 died abruptly")
    # rank 0 either raised (its collective lost its peer) or was stopped by the agent first
    assert "worker rank 0 failed after it" in result.stderr or "worker rank 0 died abruptly" in result.stderr
