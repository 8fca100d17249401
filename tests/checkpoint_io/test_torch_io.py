"""Atomic single-file writes and safe loads."""
from __future__ import annotations

import pytest
import torch

from framework.checkpoint_io.torch import TorchCheckpointIO
from framework.errors import CheckpointError


def test_round_trip(tmp_path):
    io = TorchCheckpointIO()
    io.save({"w": torch.arange(3.0), "step": 7}, tmp_path / "a.pt")
    loaded = io.load(tmp_path / "a.pt")
    assert torch.equal(loaded["w"], torch.arange(3.0)) and loaded["step"] == 7
    assert [p.name for p in tmp_path.iterdir()] == ["a.pt"]  # no temp file left behind


def test_a_failed_write_keeps_the_previous_file(tmp_path, monkeypatch):
    io = TorchCheckpointIO()
    io.save({"w": torch.ones(2)}, tmp_path / "a.pt")

    def crash(obj, f):
        f.write(b"partial bytes")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        io.save({"w": torch.zeros(2)}, tmp_path / "a.pt")
    monkeypatch.undo()
    assert torch.equal(io.load(tmp_path / "a.pt")["w"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["a.pt"]


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        TorchCheckpointIO().load(tmp_path / "nope.pt")


def test_arbitrary_objects_are_refused(tmp_path):
    torch.save({"f": print}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="could run code"):
        TorchCheckpointIO().load(tmp_path / "evil.pt")
