"""The framework's cost per optimizer step on a model where that cost shows: the digits MLP (about a
millisecond a step), against a hand-written loop doing the same work (DataLoader, forward,
cross-entropy, backward, clipping, AdamW, the cosine schedule), one process, the same threads.

Steps are timed inside each loop: the raw loop stamps the clock after every step, the framework
through a callback at `on_train_step_end` (its logging, LR monitor and non-finite checks included,
as a user's run pays them). Each run trains STEPS steps; the first WARMUP are left out (allocator
and caches warming). A round runs raw, then framework, back to back; ROUNDS rounds; the reported
ratio is the median of the rounds' ratios of mean step time, with the spread of those ratios (the
resolution: the ratio is known to about the half-width of its middle half).

    .venv/bin/python benchmarks/step_overhead.py          (about 2 minutes)
    ROUNDS=25 STEPS=1200 .venv/bin/python benchmarks/step_overhead.py   (more, shorter rounds: a
                                                          machine whose speed drifts spoils fewer)
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from overhead import run_raw
from results_table import publish  # benchmarks/ is on sys.path when a script runs
from step_timer import StepTimer

import framework

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = int(os.environ.get("ROUNDS", 9))
STEPS, WARMUP = int(os.environ.get("STEPS", 3000)), 300
OVERRIDES = ["model=mlp", "data=digits", "task=classification", "model.dropout=0.0", "trainer.val_at_start=false",
             "trainer.val_every=1000000", "callbacks.checkpoint.every_n_steps=1000000", "trainer.progress_bar=false",
             "trainer.plot=false", "seed=0", f"trainer.max_steps={STEPS}", "data.batch_size=64",
             "+callbacks.step_timer._target_=step_timer.StepTimer"]


def compose_cfg():
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose(config_name="train", overrides=OVERRIDES)


def raw_steps(cfg) -> list[float]:
    """A hand-written loop's step times (benchmarks/overhead.py's: the same work as the framework's step)."""
    stamps: list[float] = []
    run_raw(cfg, STEPS, stamps)
    return [b - a for a, b in zip(stamps, stamps[1:])]


def framework_steps(cfg) -> list[float]:
    StepTimer.stamps = []
    with tempfile.TemporaryDirectory() as out:
        framework.run(cfg, output_dir=Path(out) / "run")
    stamps = StepTimer.stamps
    return [b - a for a, b in zip(stamps, stamps[1:])]


def main() -> None:
    os.environ["FRAMEWORK_TRUST_ALLOW"] = "step_timer."
    cfg = compose_cfg()
    ratios, raw_means, framework_means = [], [], []
    for round_ in range(ROUNDS):
        raw = statistics.fmean(raw_steps(cfg)[WARMUP:])
        ours = statistics.fmean(framework_steps(cfg)[WARMUP:])
        raw_means.append(raw)
        framework_means.append(ours)
        ratios.append(ours / raw)
        print(f"round {round_ + 1}: raw {raw * 1e3:.3f} ms, framework {ours * 1e3:.3f} ms, {ours / raw:.3f}x",
              file=sys.stderr, flush=True)
    quartiles = statistics.quantiles(ratios, n=4)
    median = statistics.median(ratios)
    lines = [f"Digits MLP, batch 64, {STEPS} steps a run ({WARMUP} left out), {ROUNDS} interleaved rounds; torch "
             f"{torch.__version__}, {torch.get_num_threads()} threads.", "",
             "| loop | mean step (median over rounds) |", "|---|---|",
             f"| raw PyTorch loop | {statistics.median(raw_means) * 1e3:.3f} ms |",
             f"| this framework | {statistics.median(framework_means) * 1e3:.3f} ms |", "",
             f"Framework / raw: **{median:.3f}x** (median of the rounds' ratios; middle half {quartiles[0]:.3f}-"
             f"{quartiles[2]:.3f}, so resolved to about +-{(quartiles[2] - quartiles[0]) / 2:.3f}); "
             f"{(statistics.median(framework_means) - statistics.median(raw_means)) * 1e6:.0f} us a step more."]
    publish("step_overhead", lines)


if __name__ == "__main__":
    main()
