"""Checkpoint write timings for a ~400 MB state, side by side (A B A B ..., median of 5).

- sync: checkpoint_io=torch (temp file, fsync, rename) vs a raw torch.save of the same tensors;
- async: how long checkpoint_io=async blocks the caller (the snapshot copy) vs the full sync save,
  and how long its background write then takes;
- dcp: torch.distributed.checkpoint save and load of the same state in one process (throughput).

    .venv/bin/python benchmarks/checkpoint_io.py        (about 2 minutes)
"""
from __future__ import annotations

import importlib
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from framework.checkpoint_io.torch import TorchCheckpointIO

AsyncCheckpointIO = importlib.import_module("framework.checkpoint_io.async").AsyncCheckpointIO
ROUNDS = 5
MB = 2**20


def make_state() -> dict:
    torch.manual_seed(0)
    # 100M float32 values in 50 tensors, like a model's parameters: 400 MB
    return {f"layer{i}.weight": torch.randn(2_000_000) for i in range(50)}


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    state = make_state()
    size = sum(t.numel() * t.element_size() for t in state.values())
    rows = {"raw torch.save": [], "checkpoint_io=torch (atomic, fsync)": [], "checkpoint_io=async: blocked": [],
            "checkpoint_io=async: until written": [], "dcp save": [], "dcp load": []}
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        tmp = Path(tmp)
        sync, background = TorchCheckpointIO(), AsyncCheckpointIO()
        for _ in range(ROUNDS):
            rows["raw torch.save"].append(timed(lambda: torch.save(state, tmp / "raw.pt")))
            rows["checkpoint_io=torch (atomic, fsync)"].append(timed(lambda: sync.save(state, tmp / "sync.pt")))
            start = time.perf_counter()
            background.save(state, tmp / "async.pt")
            rows["checkpoint_io=async: blocked"].append(time.perf_counter() - start)
            background.wait()
            rows["checkpoint_io=async: until written"].append(time.perf_counter() - start)
            import torch.distributed.checkpoint as dcp

            target = tmp / "dcp"
            shutil.rmtree(target, ignore_errors=True)
            rows["dcp save"].append(timed(lambda: dcp.save(state, checkpoint_id=str(target))))
            into = {k: torch.empty_like(v) for k, v in state.items()}
            rows["dcp load"].append(timed(lambda: dcp.load(into, checkpoint_id=str(target))))
    raw = statistics.median(rows["raw torch.save"])
    lines = [f"State: {size / MB:.0f} MB of float32 tensors; {ROUNDS} interleaved rounds, medians.", "",
             "| operation | median seconds | MB/s | ratio to raw torch.save |", "|---|---|---|---|"]
    for name, times in rows.items():
        med = statistics.median(times)
        lines.append(f"| {name} | {med:.3f} | {size / MB / med:.0f} | {med / raw:.2f} |")
    table = "\n".join(lines)
    (Path(__file__).parent / "results").mkdir(exist_ok=True)
    (Path(__file__).parent / "results" / "checkpoint_io.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
