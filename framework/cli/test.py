"""`framework test RUN_DIR|CHECKPOINT [OVERRIDES...]`: score a trained model on the data's test split.

RUN_DIR is a run's directory: its best checkpoint by the run's checkpoint monitor is tested (the
newest without one). CHECKPOINT is one checkpoint directory (`<run>/checkpoints/step_...`). The
config is the run's own, composed again from the command that made it (its recipe and overrides,
from .hydra/), with OVERRIDES on top: `strategy=fsdp devices=2` tests with another strategy at
another world size (checkpoints are portable), `trainer.test_batches=10` scores fewer samples.
Results: test_metrics.json and the "test" entry of summary.json in the run directory, and a table;
with --log also the run's loggers (a row of metrics.csv at the checkpoint's step, a TensorBoard
scalar, ...).
"""
from __future__ import annotations

import argparse

from omegaconf import OmegaConf

from framework.checkpoint.format import read_meta
from framework.cli.trained_run import trained_run
from framework.config.build import build
from framework.console import warn
from framework.errors import ConfigError, ExitCode, RunExit, UserError, report
from framework.modes import run_test


def parser() -> argparse.ArgumentParser:
    test = argparse.ArgumentParser(prog="framework test", description="score a checkpoint on the data's test split")
    test.add_argument("target", help="a run directory (its best checkpoint) or a checkpoint directory")
    test.add_argument("overrides", nargs="*", help="key=value / group=option on top of the run's config")
    test.add_argument("--allow-overlap", action="store_true",
                      help="score a test split that holds samples the run trained on (refused otherwise)")
    test.add_argument("--log", action="store_true",
                      help="also send the scores to the run's loggers (metrics.csv, TensorBoard, ...) at the "
                           "checkpoint's step")
    return test


def trained_overlap(cfg, checkpoint) -> str | None:
    """What of the test split the run trained on, from the data it was trained with (its checkpoint's
    config) and the data now; None when nothing, or when that cannot be told."""
    trained_config = (read_meta(checkpoint).get("config") or {}).get("data")
    if not trained_config:
        return None
    try:
        return build(cfg.data, "data").test_overlap(build(OmegaConf.create(trained_config), "data"))
    except UserError:
        return None  # the data cannot be built as it was (files moved): nothing to compare


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        cfg, checkpoint, run_dir, why = trained_run(args.target, args.overrides, "framework test")
    except UserError as err:
        report(err)
        return ExitCode.USER_ERROR
    overlap = trained_overlap(cfg, checkpoint)
    if overlap and not args.allow_overlap:
        report(ConfigError(f"framework test: {overlap}, so its scores would flatter the model. Test on data the run "
                           "never saw (data.test_files=..., or the run's own test split: leave the data settings as "
                           "they were), or pass --allow-overlap to score it anyway."))
        return ExitCode.USER_ERROR
    if overlap:
        warn(f"{overlap} (--allow-overlap)")
    print(f"testing {checkpoint} ({why})", flush=True)
    try:
        run_test(cfg, run_dir or checkpoint.parent, why, log=args.log)
    except RunExit as exit_:
        return exit_.code
    return ExitCode.OK
