"""`framework convert`: export a checkpoint's weights (torch or safetensors), or import a DeepSpeed
native checkpoint into the framework's format."""
from __future__ import annotations

import argparse
from pathlib import Path

from framework.checkpoint.convert import export_weights, import_deepspeed
from framework.errors import ExitCode, UserError, report


def parser() -> argparse.ArgumentParser:
    convert = argparse.ArgumentParser(prog="framework convert",
                                      description="export a checkpoint's weights, or import a DeepSpeed checkpoint")
    convert.add_argument("checkpoint", help="a checkpoint directory (or, with --from deepspeed, a DeepSpeed one)")
    convert.add_argument("out", help="the file (export) or directory (import) to write")
    convert.add_argument("--to", choices=["torch", "safetensors"], default="torch", help="export format")
    convert.add_argument("--from", dest="source", choices=["framework", "deepspeed"], default="framework",
                         help="what CHECKPOINT is")
    convert.add_argument("--tag", default=None, help="with --from deepspeed: the tag (default: 'latest')")
    return convert


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        if args.source == "deepspeed":
            out = import_deepspeed(Path(args.checkpoint), Path(args.out), tag=args.tag)
        else:
            out = export_weights(Path(args.checkpoint), Path(args.out), to=args.to)
    except UserError as err:
        report(err)
        return ExitCode.USER_ERROR
    print(f"wrote {out}")
    return ExitCode.OK
