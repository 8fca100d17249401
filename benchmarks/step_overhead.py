"""The framework's cost per optimizer step on a model where that cost shows: the digits MLP (about a
millisecond a step), against a hand-written loop doing the same work (DataLoader, forward,
cross-entropy, backward, clipping, AdamW, the cosine schedule), one process, the same threads.

The two loops take turns in one process: the framework trains as a user runs it (its logging, LR
monitor and non-finite checks included), and a user's callback (benchmarks/step_timer.py
InterleavedTimer) runs the hand-written loop's next BLOCK steps after every BLOCK of the
framework's, timing each step of both. Turns a fifth of a second long keep a machine whose speed
drifts (a shared host) from favouring either loop, which back-to-back runs of seconds could not:
on this project's machine their rounds' ratios spread by +-0.1. A run trains STEPS steps of each;
the first WARMUP are left out (allocator and caches warming); ROUNDS runs, each with a fresh model.
The ratio reported is the median over blocks of (framework's block time / the hand-written block
that followed it), with the middle half of those ratios as its resolution, and beside it the
ratio of all the kept steps' summed times.

    .venv/bin/python benchmarks/step_overhead.py          (about 70 s)
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from overhead import raw_loop
from results_table import publish  # benchmarks/ is on sys.path when a script runs
from step_timer import InterleavedTimer

import framework

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = int(os.environ.get("ROUNDS", 5))
STEPS, WARMUP, BLOCK = int(os.environ.get("STEPS", 3000)), 300, 100
OVERRIDES = ["model=mlp", "data=digits", "task=classification", "model.dropout=0.0", "trainer.val_at_start=false",
             "trainer.val_every=1000000", "callbacks.checkpoint.every_n_steps=1000000", "trainer.progress_bar=false",
             "trainer.plot=false", "seed=0", f"trainer.max_steps={STEPS}", "data.batch_size=64",
             "+callbacks.step_timer._target_=step_timer.InterleavedTimer"]


def compose_cfg():
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose(config_name="train", overrides=OVERRIDES)


def interleaved_run(cfg) -> tuple[list[float], list[float]]:
    """One framework run with the hand-written loop taking its turns: each loop's step times."""
    InterleavedTimer.raw, InterleavedTimer.block = raw_loop(cfg, STEPS), BLOCK
    InterleavedTimer.framework, InterleavedTimer.hand_written = [], []
    with tempfile.TemporaryDirectory() as out:
        framework.run(cfg, output_dir=Path(out) / "run")
    return InterleavedTimer.framework, InterleavedTimer.hand_written


def main() -> None:
    os.environ["FRAMEWORK_TRUST_ALLOW"] = "step_timer."
    cfg = compose_cfg()
    block_ratios, ours_kept, raw_kept = [], [], []
    for round_ in range(ROUNDS):
        ours, raw = interleaved_run(cfg)
        assert len(ours) == len(raw) == STEPS, (len(ours), len(raw))
        ours, raw = ours[WARMUP:], raw[WARMUP:]
        ours_kept += ours
        raw_kept += raw
        ratios = [sum(ours[i:i + BLOCK]) / sum(raw[i:i + BLOCK]) for i in range(0, len(ours), BLOCK)]
        block_ratios += ratios
        print(f"round {round_ + 1}: raw {statistics.fmean(raw) * 1e3:.3f} ms, framework "
              f"{statistics.fmean(ours) * 1e3:.3f} ms, blocks' median {statistics.median(ratios):.3f}x",
              file=sys.stderr, flush=True)
    quartiles = statistics.quantiles(block_ratios, n=4)
    median = statistics.median(block_ratios)
    raw_mean, ours_mean = statistics.fmean(raw_kept), statistics.fmean(ours_kept)
    lines = [f"Digits MLP, batch 64, {ROUNDS} runs of {STEPS} steps of each loop ({WARMUP} left out), taking turns "
             f"every {BLOCK} steps in one process; {platform_line()}.", "",
             "| loop | mean step (all kept steps) |", "|---|---|",
             f"| raw PyTorch loop | {raw_mean * 1e3:.3f} ms |",
             f"| this framework | {ours_mean * 1e3:.3f} ms |", "",
             f"Framework / raw: **{median:.3f}x** (median over {len(block_ratios)} turns; middle half "
             f"{quartiles[0]:.3f}-{quartiles[2]:.3f}, so resolved to about +-{(quartiles[2] - quartiles[0]) / 2:.3f}); "
             f"summed over all kept steps {ours_mean / raw_mean:.3f}x, {(ours_mean - raw_mean) * 1e6:.0f} us a step more."]
    publish("step_overhead", lines)


def platform_line() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown CPU") if Path("/proc/cpuinfo").exists() else "unknown CPU"
    return f"{cpu}, torch {torch.__version__}, {torch.get_num_threads()} threads"


if __name__ == "__main__":
    main()
