"""The copy an async DCP save makes: independent of the live state, into buffers reused between saves."""
from __future__ import annotations

import torch

from framework.checkpoint_io.dcp import DCPCheckpointIO
from framework.checkpoint_io.dcp_reader import read_full
from framework.checkpoint_io.staging import KeptBufferStager


def test_the_copy_is_independent_of_the_live_state_and_reuses_its_buffers():
    live = {"model": {"w": torch.arange(6.0).reshape(2, 3), "step": 7},
            "optimizer": {"state": [{"exp_avg": torch.ones(4)}], "lr": 0.1}}
    stager = KeptBufferStager()
    first = stager.stage(live)
    live["model"]["w"] += 100
    live["optimizer"]["state"][0]["exp_avg"].zero_()
    assert torch.equal(first["model"]["w"], torch.arange(6.0).reshape(2, 3))
    assert torch.equal(first["optimizer"]["state"][0]["exp_avg"], torch.ones(4))
    assert (first["model"]["step"], first["optimizer"]["lr"]) == (7, 0.1)
    assert isinstance(first["optimizer"]["state"], list)

    second = stager.stage(live)  # the next save: same buffers, new values
    assert second["model"]["w"].data_ptr() == first["model"]["w"].data_ptr()
    assert torch.equal(second["model"]["w"], live["model"]["w"])
    assert torch.equal(second["optimizer"]["state"][0]["exp_avg"], torch.zeros(4))


def test_a_changed_or_vanished_tensor_gets_a_new_buffer_or_none():
    stager = KeptBufferStager()
    first = stager.stage({"a": torch.ones(2), "b": torch.ones(3)})
    second = stager.stage({"a": torch.ones(5, dtype=torch.float64)})
    assert second["a"].dtype == torch.float64 and second["a"].shape == (5,)
    assert second["a"].data_ptr() != first["a"].data_ptr()
    assert list(stager._buffers) == [("a",)]  # b's buffer is freed
    stager.close()
    assert not stager._buffers


def test_dtensor_shards_are_copied_as_their_local_part_and_rewrapped(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    live = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)])
    staged = KeptBufferStager().stage({"w": live})["w"]
    live.to_local().add_(1)
    assert isinstance(staged, DTensor)
    assert (staged.placements, staged.shape, staged.device_mesh) == (live.placements, live.shape, mesh)
    assert torch.equal(staged.full_tensor(), torch.arange(8.0).reshape(4, 2))


def test_async_saves_of_one_run_share_one_stager_and_write_each_state(tmp_path):
    io = DCPCheckpointIO(async_save=True)
    live = {"w": torch.zeros(3)}
    for step in range(3):
        live["w"].fill_(step)
        io.save_sharded({"model": live}, tmp_path / f"step{step}")
        live["w"].fill_(-1)  # training changes the live tensor while the write runs
        io.wait()
    assert [float(read_full(tmp_path / f"step{s}")["model"]["w"][0]) for s in range(3)] == [0.0, 1.0, 2.0]
    assert io._stager is not None and len(io._stager._buffers) == 1
    io.close()
    assert io._stager is None


def test_without_kept_buffers_dcp_makes_its_own_copy(tmp_path):
    io = DCPCheckpointIO(async_save=True, keep_staging_buffers=False)
    live = {"w": torch.ones(2)}
    io.save_sharded({"model": live}, tmp_path / "state")
    live["w"].zero_()
    io.close()
    assert torch.equal(read_full(tmp_path / "state")["model"]["w"], torch.ones(2)) and io._stager is None
