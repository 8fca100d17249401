"""DDP on this 2-core machine: 2 processes x 1 thread (strategy=ddp devices=2, batch 32 each)
vs 1 process x 2 threads (single_device, batch 64): the same global batch of the default GPT.
Steady-state time per step by difference (N2 - N1 steps), interleaved rounds, medians; the
ratio is the throughput of the first over the second.

    .venv-bench/bin/python benchmarks/ddp_threads.py       (about 4 minutes)
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from results_table import publish  # benchmarks/ is on sys.path when a script runs

import framework

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 5
N1, N2 = 10, 30
SETUPS = {
    "2 processes x 1 thread (ddp, batch 32 each)": ["strategy=ddp", "devices=2", "data.batch_size=32"],
    "1 process x 2 threads (single_device, batch 64)": ["strategy=single_device", "devices=1", "data.batch_size=64"],
}
COMMON = ["trainer.val_at_start=false", "trainer.val_every=1000000", "trainer.progress_bar=false"]


def seconds(overrides: list[str], steps: int) -> float:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="train", overrides=[*overrides, *COMMON, f"trainer.max_steps={steps}"])
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        framework.run(cfg, output_dir=Path(out) / "run")
        return time.perf_counter() - start


def main() -> None:
    per_step = {name: [] for name in SETUPS}
    for _ in range(ROUNDS):
        for name, overrides in SETUPS.items():
            per_step[name].append((seconds(overrides, N2) - seconds(overrides, N1)) / (N2 - N1))
    medians = {name: statistics.median(v) for name, v in per_step.items()}
    tokens = 64 * 128  # global batch x block size
    first, second = list(medians)
    lines = [f"Default GPT, global batch 64 x 128 tokens; {ROUNDS} interleaved rounds, medians.", "",
             "| setup | ms per step | tokens/s |", "|---|---|---|"]
    for name, med in medians.items():
        lines.append(f"| {name} | {med * 1000:.0f} | {tokens / med:,.0f} |")
    lines += ["", f"Throughput ratio, 2x1 over 1x2: {medians[second] / medians[first]:.2f}"]
    publish("ddp_threads", lines)


if __name__ == "__main__":
    main()
