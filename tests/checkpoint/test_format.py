"""The checkpoint directory: completeness, truncation, safety, resume=auto, retention."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch

from framework.callbacks.checkpoint import ModelCheckpoint
from framework.checkpoint.format import (
    PendingCheckpoint,
    _stop_together_on_failure,
    list_checkpoints,
    load_checkpoint_files,
    read_meta,
)
from framework.checkpoint_io.torch import TorchCheckpointIO
from framework.errors import CheckpointError, StorageError
from tests.conftest import DIGITS, checkpoints, run_inprocess

FAST = [*DIGITS, "trainer.max_steps=4", "trainer.val_every=2", "callbacks.checkpoint.every_n_steps=2",
        "callbacks.checkpoint.keep_last_k=3"]


@pytest.fixture
def run_dir(tmp_path):
    run_inprocess(FAST, tmp_path / "run")
    return tmp_path / "run"


def test_layout_and_metadata(run_dir):
    ckpt = checkpoints(run_dir)[-1]
    assert sorted(p.name for p in ckpt.iterdir()) == ["loop_rank0.pt", "meta.json", "model.pt", "optimizer.pt"]
    meta = read_meta(ckpt)
    assert meta["step"] == 4 and meta["world_size"] == 1
    assert (meta["strategy"], meta["precision"], meta["accelerator"]) == ("single_device", "32", "cpu")
    assert meta["versions"]["torch"] == torch.__version__
    assert meta["config"]["trainer"]["max_steps"] == 4
    assert meta["files"]["model.pt"] == (ckpt / "model.pt").stat().st_size
    assert "val/loss" in meta["metrics"]
    model = torch.load(ckpt / "model.pt", weights_only=True)
    assert set(model) == {"net.0.weight", "net.0.bias", "net.3.weight", "net.3.bias", "net.6.weight", "net.6.bias"}


def test_truncated_file_is_reported_as_truncated(run_dir):
    ckpt = checkpoints(run_dir)[-1]
    data = (ckpt / "model.pt").read_bytes()
    (ckpt / "model.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.pt is truncated or corrupt"):
        load_checkpoint_files(TorchCheckpointIO(), ckpt, 0)


def test_corrupt_bytes_of_the_right_size_are_reported(run_dir):
    ckpt = checkpoints(run_dir)[-1]
    size = (ckpt / "model.pt").stat().st_size
    (ckpt / "model.pt").write_bytes(b"\0" * size)
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint_files(TorchCheckpointIO(), ckpt, 0)


def test_missing_meta_means_incomplete(run_dir):
    ckpt = checkpoints(run_dir)[-1]
    (ckpt / "meta.json").unlink()
    with pytest.raises(CheckpointError, match="not a complete checkpoint: meta.json is missing"):
        read_meta(ckpt)


def test_pickled_callable_is_refused(run_dir):
    ckpt = checkpoints(run_dir)[-1]
    torch.save({"weight": torch.ones(1), "hook": os.system}, ckpt / "model.pt")
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["files"]["model.pt"] = (ckpt / "model.pt").stat().st_size
    (ckpt / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="refused because loading them could run code"):
        load_checkpoint_files(TorchCheckpointIO(), ckpt, 0)


def test_resume_auto_ignores_a_partial_write_and_says_so(run_dir, capsys):
    partial = run_dir / "checkpoints" / ".partial-step_000006"
    partial.mkdir()
    (partial / "model.pt").write_bytes(b"half")
    run_inprocess([*FAST, "trainer.max_steps=6", "resume=auto"], run_dir)
    out = capsys.readouterr().out
    assert "ignoring incomplete checkpoint" in out and ".partial-step_000006" in out
    assert "resumed from" in out and "step_000004" in out
    assert checkpoints(run_dir)[-1].name == "step_000006"


def test_a_new_run_never_overwrites_an_earlier_runs_checkpoints(run_dir, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_inprocess(FAST, run_dir)
    assert exit_.value.code == 2
    assert "already holds checkpoints" in capsys.readouterr().err
    assert [p.name for p in checkpoints(run_dir)] == ["step_000002", "step_000004"]


def test_keep_last_k_and_best_k(tmp_path):
    root = tmp_path / "checkpoints"
    losses = {1: 0.5, 2: 0.1, 3: 0.4, 4: 0.3, 5: 0.6}
    for step, loss in losses.items():
        d = root / f"step_{step:06d}"
        d.mkdir(parents=True)
        (d / "meta.json").write_text(json.dumps({"format_version": 1, "step": step, "files": {},
                                                 "metrics": {"val/loss": loss}}))
    callback = ModelCheckpoint(keep_last_k=2, best_k=1, monitor="val/loss", mode="min")
    removed = callback.prune(root)
    assert sorted(p.name for p in removed) == ["step_000001", "step_000003"]
    complete, _ = list_checkpoints(root)
    assert [c.step for c in complete] == [2, 4, 5]
    assert callback.best(root).step == 2
    assert ModelCheckpoint(keep_last_k=0, best_k=2, monitor="val/loss", mode="max").best(root).step == 5


class OtherRankFilledTheDisk:
    """A strategy as seen by rank 0 of 2 when rank 1's write met the full disk and its own did not."""
    is_global_zero = True
    checkpoint_io = SimpleNamespace(discard=lambda: None)

    def any_rank(self, flag: bool) -> bool:
        return True  # rank 1 failed, and with ENOSPC

    def barrier(self) -> None:
        pass


def test_every_rank_names_the_full_disk_whichever_rank_met_it(tmp_path):
    partial = tmp_path / "checkpoints" / "step_000006.partial"
    partial.mkdir(parents=True)
    pending = PendingCheckpoint(partial=partial, final=tmp_path / "checkpoints" / "step_000006", step=6, meta={})
    with pytest.raises(StorageError, match="the disk is full: checkpoint step_000006 did not fit"):
        _stop_together_on_failure(OtherRankFilledTheDisk(), pending, failure=None)
    assert not partial.exists()
