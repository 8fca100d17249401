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

from framework.cli.trained_run import trained_run
from framework.errors import ExitCode, RunExit, UserError, report
from framework.runner import run_test


def parser() -> argparse.ArgumentParser:
    test = argparse.ArgumentParser(prog="framework test", description="score a checkpoint on the data's test split")
    test.add_argument("target", help="a run directory (its best checkpoint) or a checkpoint directory")
    test.add_argument("overrides", nargs="*", help="key=value / group=option on top of the run's config")
    test.add_argument("--log", action="store_true",
                      help="also send the scores to the run's loggers (metrics.csv, TensorBoard, ...) at the "
                           "checkpoint's step")
    return test


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        cfg, checkpoint, run_dir, why = trained_run(args.target, args.overrides, "framework test")
    except UserError as err:
        report(err)
        return ExitCode.USER_ERROR
    print(f"testing {checkpoint} ({why})", flush=True)
    try:
        run_test(cfg, run_dir or checkpoint.parent, why, log=args.log)
    except RunExit as exit_:
        return exit_.code
    return ExitCode.OK
