"""`framework predict RUN_DIR|CHECKPOINT [OVERRIDES...] -o predictions.jsonl|.parquet`: one row per
sample with what the task predicts (the classifier: the class, every class's probability and the
label; a language model: each sequence's loss, perplexity and scored tokens; the GAN: the
discriminator's probability that a point is real, and a generated point).

The samples are those of a split of the run's data (--split, default test; trainer.test_batches /
val_batches limit them as in testing); give the data other files with overrides (e.g.
`data.test_files=new.jsonl`). Rows come in the data's order whatever the strategy and world size
(`strategy=ddp devices=2`: each rank predicts its share and the shares are merged), each with its
`index` in the split.
"""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from framework.cli.trained_run import trained_run
from framework.data.splits import SPLITS
from framework.errors import ConfigError, ExitCode, RunExit, UserError, report
from framework.modes import run_predict
from framework.results import PREDICTION_FORMATS

COMMAND = "framework predict"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=COMMAND, description="one row per sample with what the task predicts")
    p.add_argument("target", help="a run directory (its best checkpoint) or a checkpoint directory")
    p.add_argument("overrides", nargs="*", help="key=value / group=option on top of the run's config")
    p.add_argument("-o", "--output", required=True, help="the file to write: .jsonl or .parquet")
    p.add_argument("--split", choices=SPLITS, default="test", help="which of the data's splits (default: test)")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_intermixed_args(argv)  # options may come between the overrides
    out = Path(args.output).expanduser().resolve()
    try:
        if out.suffix not in PREDICTION_FORMATS:
            raise ConfigError(f"-o {args.output}: write predictions to a {' or '.join(PREDICTION_FORMATS)} file.")
        if out.suffix == ".parquet" and importlib.util.find_spec("pyarrow") is None:
            raise ConfigError("-o *.parquet needs pyarrow: pip install pyarrow (or write .jsonl).")
        cfg, checkpoint, _, why = trained_run(args.target, args.overrides, COMMAND)
    except UserError as err:
        report(err)
        return ExitCode.USER_ERROR
    print(f"predicting with {checkpoint} ({why})", flush=True)
    try:
        rows = run_predict(cfg, out, args.split)
    except RunExit as exit_:
        return exit_.code
    print(f"wrote {rows} rows to {out}")
    return ExitCode.OK
