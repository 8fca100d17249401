"""The background writer: non-blocking saves of a snapshot, ordered writes, errors surfaced."""
from __future__ import annotations

import importlib
import threading

import pytest
import torch

from framework.checkpoint_io.torch import TorchCheckpointIO
from framework.errors import CheckpointError
from tests.conftest import TINY_GPT, assert_resume_is_exact, checkpoints

AsyncCheckpointIO = importlib.import_module("framework.checkpoint_io.async").AsyncCheckpointIO


def test_save_returns_before_the_write_and_writes_a_snapshot(tmp_path, monkeypatch):
    release = threading.Event()
    real_save = TorchCheckpointIO.save

    def gated_save(self, obj, path):
        release.wait(timeout=30)
        real_save(self, obj, path)

    monkeypatch.setattr(TorchCheckpointIO, "save", gated_save)
    io = AsyncCheckpointIO()
    live = torch.zeros(3)
    io.save({"w": live}, tmp_path / "a.pt")
    assert io.pending() and not (tmp_path / "a.pt").exists()  # returned while the writer is blocked
    live += 5  # training goes on changing the live tensor
    release.set()
    io.wait()
    assert not io.pending()
    assert torch.equal(io.load(tmp_path / "a.pt")["w"], torch.zeros(3))


def test_a_writer_error_is_raised_not_swallowed(tmp_path):
    io = AsyncCheckpointIO()
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    io.save({"w": torch.ones(1)}, blocker / "sub" / "a.pt")  # the writer cannot create this folder
    with pytest.raises(CheckpointError, match="background checkpoint writer failed"):
        io.wait()
    io.save({"w": torch.ones(1)}, tmp_path / "ok.pt")  # the writer recovers for later saves
    io.wait()
    assert (tmp_path / "ok.pt").exists()


def test_async_checkpoints_resume_exactly(tmp_path):
    base = [*TINY_GPT, "checkpoint_io=async", "model.dropout=0.1", "trainer.val_every=3", "scheduler.total_steps=8",
            "callbacks.checkpoint.every_n_steps=4", "callbacks.checkpoint.keep_last_k=3"]
    straight, _ = assert_resume_is_exact(base, tmp_path, 8)
    assert [p.name for p in checkpoints(straight.parent.parent)] == ["step_000004", "step_000008"]
