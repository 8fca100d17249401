"""checkpoint_io=dcp: the sharded layout, exact resumes (sync and async), safety, every rank
writing its own shards, and loading across CheckpointIOs."""
from __future__ import annotations

import os
import pickle
import threading

import pytest
import torch
import torch.distributed.checkpoint as dcp

from framework.checkpoint.format import load_checkpoint_files, read_meta
from framework.checkpoint_io.dcp import DCPCheckpointIO
from framework.checkpoint_io.dcp_reader import read_full, read_metadata
from framework.errors import CheckpointError
from tests.conftest import (
    DIGITS,
    TINY_GPT,
    assert_resume_is_exact,
    assert_state_equal,
    checkpoints,
    load_model_state,
    run_inprocess,
)

FAST = [*DIGITS, "checkpoint_io=dcp", "trainer.val_every=2", "callbacks.checkpoint.every_n_steps=2",
        "callbacks.checkpoint.keep_last_k=3", "logger=null"]


@pytest.fixture(scope="module")
def dcp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dcp") / "run"
    run_inprocess([*FAST, "trainer.max_steps=4"], out)
    return out


def test_layout_and_metadata(dcp_run):
    ckpt = checkpoints(dcp_run)[-1]
    assert sorted(p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*")) == [
        "loop_rank0.pt", "meta.json", "state", "state/.metadata", "state/__0_0.distcp"]
    meta = read_meta(ckpt)
    assert meta["layout"] == "sharded" and meta["checkpoint_io"] == "dcp" and meta["step"] == 4
    assert meta["files"]["state/__0_0.distcp"] == (ckpt / "state" / "__0_0.distcp").stat().st_size
    saved = read_full(ckpt / "state")
    assert set(saved) == {"model", "optimizer"}
    assert set(saved["model"]) == {"net.0.weight", "net.0.bias", "net.3.weight", "net.3.bias", "net.6.weight",
                                   "net.6.bias"}
    assert saved["optimizer"]["state"]["net.0.weight"]["step"].item() == 4.0
    assert saved["optimizer"]["param_groups"][0]["params"][0] == "net.0.weight"


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_resume_is_exact(tmp_path, async_save):
    base = [*TINY_GPT, "checkpoint_io=dcp", f"checkpoint_io.async_save={str(async_save).lower()}",
            "model.dropout=0.1", "trainer.val_every=3", "scheduler.total_steps=8",
            "callbacks.checkpoint.every_n_steps=4", "callbacks.checkpoint.keep_last_k=3"]
    _, resumed = assert_resume_is_exact(base, tmp_path, 8)
    assert read_meta(resumed)["layout"] == "sharded"


def test_a_sharded_checkpoint_resumes_under_checkpoint_io_torch_and_back(tmp_path):
    """Reading goes by the layout on disk, not by the configured writer."""
    plain = [*DIGITS, "trainer.val_every=2", "callbacks.checkpoint.every_n_steps=2",
             "callbacks.checkpoint.keep_last_k=3", "logger=null"]
    straight, mixed = tmp_path / "straight", tmp_path / "mixed"
    run_inprocess([*plain, "trainer.max_steps=6"], straight)
    run_inprocess([*plain, "checkpoint_io=dcp", "trainer.max_steps=2"], mixed)
    run_inprocess([*plain, "trainer.max_steps=4", "resume=auto"], mixed)  # dcp -> torch
    run_inprocess([*plain, "checkpoint_io=dcp", "trainer.max_steps=6", "resume=auto"], mixed)  # torch -> dcp
    layouts = [read_meta(c)["layout"] for c in checkpoints(mixed)]
    assert layouts[-3:] == ["sharded", "full", "sharded"]
    assert_state_equal(load_model_state(checkpoints(straight)[-1]), load_model_state(checkpoints(mixed)[-1]))


def test_a_truncated_shard_is_reported(dcp_run, tmp_path):
    ckpt = checkpoints(dcp_run)[0]
    shard = ckpt / "state" / "__0_0.distcp"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"__0_0.distcp is truncated or corrupt"):
        load_checkpoint_files(DCPCheckpointIO(), ckpt, 0)
    shard.write_bytes(data)


def test_a_pickled_callable_among_the_values_is_refused(tmp_path):
    dcp.save({"model": {"w": torch.ones(2)}, "optimizer": {"hook": os.system}}, checkpoint_id=str(tmp_path))
    with pytest.raises(CheckpointError, match="'optimizer.hook' holds objects other than tensors"):
        read_full(tmp_path)
    assert torch.equal(read_full(tmp_path, ("model",))["model"]["w"], torch.ones(2))  # the rest stays readable


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_metadata_file_that_would_run_code_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".metadata").write_bytes(pickle.dumps(_RunsCode()))
    with pytest.raises(CheckpointError, match=r"refused because loading it could run code: it names posix.system"):
        read_metadata(tmp_path)
    assert not (tmp_path / "pwned").exists()


def test_a_corrupt_metadata_file_is_reported(tmp_path):
    (tmp_path / ".metadata").write_bytes(b"\x80\x04garbage")
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        read_metadata(tmp_path)


def test_async_save_returns_before_the_write_and_writes_a_snapshot(tmp_path, monkeypatch):
    from torch.distributed.checkpoint import FileSystemWriter

    release = threading.Event()
    real_write = FileSystemWriter.write_data

    def gated_write(self, plan, planner):
        release.wait(timeout=30)
        return real_write(self, plan, planner)

    monkeypatch.setattr(FileSystemWriter, "write_data", gated_write)
    io = DCPCheckpointIO(async_save=True)
    assert io.is_async
    live = torch.zeros(3)
    io.save_sharded({"model": {"w": live}}, tmp_path / "state")
    assert io.pending() and not (tmp_path / "state" / ".metadata").exists()
    live += 5  # training goes on changing the live tensor
    release.set()
    io.wait()
    assert not io.pending()
    assert torch.equal(read_full(tmp_path / "state")["model"]["w"], torch.zeros(3))


def test_an_async_write_error_is_raised_not_swallowed(tmp_path):
    io = DCPCheckpointIO(async_save=True)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    io.save_sharded({"model": {"w": torch.ones(1)}}, blocker / "state")  # cannot create this folder
    with pytest.raises(CheckpointError, match="background sharded checkpoint write failed"):
        io.wait()
    io.save_sharded({"model": {"w": torch.ones(1)}}, tmp_path / "ok")  # later saves still work
    io.wait()
    assert (tmp_path / "ok" / ".metadata").exists()


def test_a_sync_write_error_names_the_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(CheckpointError, match="writing the sharded checkpoint .*file/state failed"):
        DCPCheckpointIO().save_sharded({"model": {"w": torch.ones(1)}}, blocker / "state")


@pytest.mark.slow
def test_each_rank_writes_its_own_fsdp_shards(tmp_path):
    """(Exact resumes of fsdp and deepspeed with checkpoint_io=dcp: tests/strategy/test_multiprocess.py.)"""
    run_inprocess([*TINY_GPT, "strategy=fsdp", "devices=2", "checkpoint_io=dcp", "trainer.max_steps=2",
                   "logger=null"], tmp_path / "run")
    ckpt = checkpoints(tmp_path / "run")[-1]
    shards = [(ckpt / "state" / f"__{r}_0.distcp").stat().st_size for r in (0, 1)]
    assert all(size > 0.3 * sum(shards) for size in shards), shards  # each rank wrote about half
    meta = read_meta(ckpt)
    assert (meta["world_size"], meta["strategy"], meta["layout"]) == (2, "fsdp", "sharded")
    assert meta["files"]["state/__1_0.distcp"] == shards[1]
