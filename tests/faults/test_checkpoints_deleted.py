"""Checkpoints removed under a running job (another process deleting the newest one, or the
whole checkpoints folder): the next save still succeeds, pruning never fails over them, and no
setting of keep_last_k / best_k deletes the only complete checkpoint."""
from __future__ import annotations

import pytest

from framework.checkpoint.format import list_checkpoints
from tests.conftest import DIGITS, run_inprocess

VANDAL = "+callbacks.vandal={_target_: tests.helpers.vandal.DeleteCheckpoints, at_step: 3, what: %s}"


@pytest.fixture(autouse=True)
def trust_test_helpers(monkeypatch):
    monkeypatch.setenv("FRAMEWORK_TRUST_ALLOW", "tests.helpers.")


def steps(run_dir) -> list[int]:
    complete, partial = list_checkpoints(run_dir / "checkpoints")
    assert partial == []
    return [c.step for c in complete]


def test_the_checkpoints_folder_deleted_mid_run_is_made_again_and_the_run_resumes(tmp_path):
    base = [*DIGITS, "callbacks.checkpoint.every_n_steps=2", "callbacks.checkpoint.keep_last_k=5"]
    run_inprocess([*base, "trainer.max_steps=6", VANDAL % "all"], tmp_path / "run")
    assert steps(tmp_path / "run") == [4, 6]  # step 2's went with the folder; the saves after it succeeded
    run_inprocess([*base, "trainer.max_steps=8", "resume=auto"], tmp_path / "run")
    assert steps(tmp_path / "run") == [4, 6, 8]


def test_keeping_none_still_keeps_the_newest_and_a_vanished_one_is_no_error(tmp_path):
    run_inprocess([*DIGITS, "callbacks.checkpoint.every_n_steps=2", "callbacks.checkpoint.keep_last_k=0",
                   "callbacks.checkpoint.best_k=0", "trainer.max_steps=6", VANDAL % "newest"], tmp_path / "run")
    assert steps(tmp_path / "run") == [6]
