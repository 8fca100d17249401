"""A rank that stops answering (its process stopped with SIGSTOP): the others give up within
strategy.timeout_s, the message names the rank and where the others waited, no process is left
behind; with trainer.max_restarts=1 the group restarts from the newest checkpoint and finishes
with the weights of an undisturbed run."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from framework.errors import ExitCode
from tests.conftest import TINY_GPT, assert_state_equal, load_model_state, run_train
from tests.helpers.in_process import run_command

RUN = [*TINY_GPT, "strategy=ddp", "devices=2", "strategy.timeout_s=8", "trainer.max_steps=8",
       "callbacks.checkpoint.every_n_steps=2", "trainer.val_every=100"]
STOP = "+callbacks.stop={_target_: tests.helpers.stopper.StopRank, rank: 1, at_step: 3, pid_file: %s}"
ENV = {"FRAMEWORK_TRUST_ALLOW": "tests.helpers."}


def gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


@pytest.mark.slow
def test_a_stopped_rank_is_named_and_the_group_torn_down(tmp_path):
    result = run_train([*RUN, STOP % (tmp_path / "stopped.pid"), f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                       env=ENV)
    assert result.returncode == ExitCode.FAILED, (result.stdout[-2000:], result.stderr[-3000:])
    first = result.stderr.strip().splitlines()[0]
    assert first.startswith("error: worker rank 1 stopped answering (its process is stopped (SIGSTOP"), first
    assert "rank 0 waited for it in " in first and "until strategy.timeout_s ran out" in first
    assert gone(int((tmp_path / "stopped.pid").read_text()))  # nothing left behind


@pytest.mark.slow
def test_with_a_restart_the_group_recovers_and_ends_as_an_undisturbed_run(tmp_path):
    result = run_train([*RUN, STOP % (tmp_path / "stopped.pid"), "trainer.max_restarts=1",
                        f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    straight = run_command(["train", *RUN, f"hydra.run.dir={tmp_path / 'straight'}"], tmp_path, env=ENV)  # in this process
    assert straight.returncode == 0, straight.stderr[-3000:]
    step = "checkpoints/step_000008"
    assert_state_equal(load_model_state(tmp_path / "run" / step), load_model_state(tmp_path / "straight" / step))
    assert os.path.exists(tmp_path / "stopped.pid") and gone(int((tmp_path / "stopped.pid").read_text()))
