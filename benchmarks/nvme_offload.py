"""ZeRO-3 with NVMe offload under a memory cap: the framework's swap buffers, sized from the model,
against DeepSpeed's own defaults (1e8-element parameter buffers, the first 1e9 parameter elements
kept in RAM), as a user meets them: `python train.py ...` in a cgroup of its own.

A 114M GPT (16 layers, width 768), whose float32 states with Adam (16 bytes a parameter, 1.8 GB)
are larger than the 1.25 GiB cap, one process, one step. tests/strategy/test_nvme_offload.py checks
that the framework's sizes train it under the cap, with its memory within 25% of the plan; this
shows what DeepSpeed's own sizes do under the same cap (killed by the kernel, on this project's
machines). Needs libaio (apt-get install libaio-dev) and root. Writes
benchmarks/results/nvme_offload.md.

    .venv/bin/python benchmarks/nvme_offload.py        (as root; a few minutes, the op's first build on top)
"""
from __future__ import annotations

import ctypes.util
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cgroup  # noqa: E402
from memory_per_rank import ROOT, MiB  # noqa: E402
from results_table import publish  # noqa: E402

CAP = 1280 * MiB
MODEL = ["model.n_layer=16", "model.n_embd=768", "model.n_head=12", "model.block_size=64", "model.dropout=0.0"]
RUN = ["data.batch_size=1", "data.val_batch_size=1", "data.max_bytes=300000", "strategy=deepspeed_stage_3_offload_nvme",
       "trainer.max_steps=1", "trainer.val_at_start=false", "trainer.val_batches=1", "trainer.log_every=1",
       "trainer.progress_bar=false", "trainer.plot=false", "callbacks=[memory_monitor]"]
BUFFERS = {
    "the framework's (from the model)": [],
    "DeepSpeed's defaults": ["+strategy.config={zero_optimization:{offload_param:{buffer_size:100000000,"
                             "max_in_cpu:1000000000}}}"],
}


def main() -> None:
    why = cgroup.available() or (None if ctypes.util.find_library("aio") else "libaio is not installed")
    if why:
        sys.exit(f"nvme_offload: {why}")
    lines = [f"A 114M GPT (16 x 768), one process, ZeRO-3 with NVMe offload, one step, the whole job capped at "
             f"{CAP / MiB:.0f} MiB (its float32 states with Adam: 1.8 GB).", "",
             "| swap buffers | outcome | whole job's peak (MiB) | seconds |", "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, extra) in enumerate(BUFFERS.items()):
            out = Path(tmp) / f"run{i}"
            command = [sys.executable, str(ROOT / "train.py"), *MODEL, *RUN, f"strategy.nvme_path={Path(tmp) / 'swap'}",
                       *extra, f"hydra.run.dir={out}"]
            result = cgroup.run(command, cap_bytes=CAP, cwd=Path(tmp))
            outcome = ("trained" if result.returncode == 0 else
                       "killed at the cap (out of memory)" if result.oom_killed else f"failed ({result.returncode})")
            lines.append(f"| {name} | {outcome} | {result.peak_bytes / MiB:.0f} | {result.seconds:.0f} |")
            if result.returncode and not result.oom_killed:
                print(result.stderr[-2000:], file=sys.stderr)
            print(lines[-1], flush=True)
    publish("nvme_offload", lines)


if __name__ == "__main__":
    main()
