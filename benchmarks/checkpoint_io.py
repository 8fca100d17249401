"""Checkpoint write and read timings for a ~400 MB state, side by side (A B A B ..., median of 5).

- sync: checkpoint_io=torch (temp file, fsync, rename) vs a raw torch.save of the same tensors;
- async: how long checkpoint_io=async blocks the caller (the snapshot copy) vs the full sync save,
  and how long its background write then takes;
- dcp: checkpoint_io=dcp save (sync, and the time an async_save blocks the caller) and load, by one
  process holding the whole state and by 2 processes (gloo) each holding half of every tensor as
  a DTensor shard, as FSDP does. Each round runs the one-process and the two-process cases back
  to back, so the machine's noise falls on both.

    .venv/bin/python benchmarks/checkpoint_io.py        (about 3 minutes)
"""
from __future__ import annotations

import importlib
import os
import shutil
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
from results_table import publish  # benchmarks/ is on sys.path when a script runs

from framework.checkpoint_io.dcp import DCPCheckpointIO
from framework.checkpoint_io.dcp_reader import load_into
from framework.checkpoint_io.torch import TorchCheckpointIO

AsyncCheckpointIO = importlib.import_module("framework.checkpoint_io.async").AsyncCheckpointIO
ROUNDS = 5
MB = 2**20
DCP_ROWS = ("dcp save (sync)", "dcp async_save: blocked", "dcp async_save: until written", "dcp load")


def make_state() -> dict:
    torch.manual_seed(0)
    # 100M float32 values in 50 tensors, like a model's parameters: 400 MB
    return {f"layer{i}.weight": torch.randn(2_000_000) for i in range(50)}


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class DCPPair:
    """A sync and an async checkpoint_io=dcp, made once per process as in a run (where the plugin
    lives for the whole run: its gloo group and cached save plans are made by the first save)."""

    def __init__(self):
        self.sync, self.background = DCPCheckpointIO(), DCPCheckpointIO(async_save=True)


def dcp_round(ios: DCPPair, state: dict, template: dict, target: Path, barrier=lambda: None) -> dict[str, float]:
    """One save (sync), one async save and one load of `state` through checkpoint_io=dcp; every
    process of a group calls it (the barrier lines them up so each time spans all ranks)."""
    out = {}
    sync, background = ios.sync, ios.background
    for name in ("sync", "async"):
        shutil.rmtree(target / name, ignore_errors=True)
    barrier()
    out["dcp save (sync)"] = timed(lambda: (sync.save_sharded({"model": state}, target / "sync"), barrier()))
    barrier()
    start = time.perf_counter()
    background.save_sharded({"model": state}, target / "async")
    out["dcp async_save: blocked"] = time.perf_counter() - start
    background.wait()
    barrier()
    out["dcp async_save: until written"] = time.perf_counter() - start
    out["dcp load"] = timed(lambda: (load_into({"model": template}, target / "sync"), barrier()))
    return out


def two_rank_worker(rank: int, port: int, root: str, commands, results) -> None:
    """Each rank holds half of every tensor (DTensor, Shard(0)) and runs a dcp round on command."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    state = {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in make_state().items()}
    template = {k: distribute_tensor(torch.empty_like(v.full_tensor()), mesh, [Shard(0)]) for k, v in state.items()}
    ios = DCPPair()
    dcp_round(ios, state, template, Path(root) / "two", barrier=dist.barrier)  # warm-up: the run's first save
    while commands[rank].get() == "round":
        times = dcp_round(ios, state, template, Path(root) / "two", barrier=dist.barrier)
        results.put((rank, times))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    state = make_state()
    size = sum(t.numel() * t.element_size() for t in state.values())
    rows = {"raw torch.save": [], "checkpoint_io=torch (atomic, fsync)": [], "checkpoint_io=async: blocked": [],
            "checkpoint_io=async: until written": []}
    rows.update({f"{name}, 1 process": [] for name in DCP_ROWS})
    rows.update({f"{name}, 2 processes": [] for name in DCP_ROWS})
    template = {k: torch.empty_like(v) for k, v in state.items()}
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        tmp = Path(tmp)
        ctx = mp.get_context("spawn")
        commands, results = [ctx.Queue(), ctx.Queue()], ctx.Queue()
        port = free_port()
        workers = [ctx.Process(target=two_rank_worker, args=(r, port, str(tmp), commands, results)) for r in range(2)]
        for w in workers:
            w.start()
        sync, background = TorchCheckpointIO(), AsyncCheckpointIO()
        ios = DCPPair()
        dcp_round(ios, state, template, tmp / "one")  # warm-up, as in the 2-process workers
        for _ in range(ROUNDS):
            rows["raw torch.save"].append(timed(lambda: torch.save(state, tmp / "raw.pt")))
            rows["checkpoint_io=torch (atomic, fsync)"].append(timed(lambda: sync.save(state, tmp / "sync.pt")))
            start = time.perf_counter()
            background.save(state, tmp / "async.pt")
            rows["checkpoint_io=async: blocked"].append(time.perf_counter() - start)
            background.wait()
            rows["checkpoint_io=async: until written"].append(time.perf_counter() - start)
            for name, seconds in dcp_round(ios, state, template, tmp / "one").items():
                rows[f"{name}, 1 process"].append(seconds)
            for queue in commands:
                queue.put("round")
            per_rank = dict(results.get(timeout=600) for _ in range(2))
            for name in DCP_ROWS:  # the slower rank's time: the save is done when both are
                rows[f"{name}, 2 processes"].append(max(per_rank[0][name], per_rank[1][name]))
        for queue in commands:
            queue.put("stop")
        for w in workers:
            w.join(timeout=120)
    raw = statistics.median(rows["raw torch.save"])
    lines = [f"State: {size / MB:.0f} MB of float32 tensors (50 x 2M); {ROUNDS} interleaved rounds, medians. With 2 "
             "processes each holds half of every tensor and the time is the slower rank's.", "",
             "| operation | median seconds | MB/s (whole state) | ratio to raw torch.save |", "|---|---|---|---|"]
    for name, times in rows.items():
        med = statistics.median(times)
        lines.append(f"| {name} | {med:.3f} | {size / MB / med:.0f} | {med / raw:.2f} |")
    publish("checkpoint_io", lines)


if __name__ == "__main__":
    main()
