"""The `framework` command (also `python -m framework`).

    framework train [OVERRIDES...]        the same as `python train.py [OVERRIDES...]`
    framework convert CKPT --to torch OUT.pt    model weights as a plain state_dict (or safetensors)
    framework convert DS_DIR --from deepspeed OUT_DIR   a DeepSpeed native checkpoint, imported
    framework version                     framework, torch and Python versions
"""
from __future__ import annotations

import argparse
import sys


def _train(overrides: list[str]) -> int:
    import hydra

    import framework
    from framework.paths import conf_dir

    @hydra.main(version_base=None, config_path=str(conf_dir()), config_name="train")
    def main(cfg):
        return framework.run(cfg)

    sys.argv = ["framework train", *overrides]
    framework.guard(main)
    return 0


def _convert(args) -> int:
    from pathlib import Path

    from framework.checkpoint.convert import export_weights, import_deepspeed
    from framework.errors import UserError, report

    try:
        if args.source == "deepspeed":
            out = import_deepspeed(Path(args.checkpoint), Path(args.out), tag=args.tag)
        else:
            out = export_weights(Path(args.checkpoint), Path(args.out), to=args.to)
    except UserError as err:
        report(err)
        return 2
    print(f"wrote {out}")
    return 0


def _version() -> int:
    import platform

    import torch

    import framework

    print(f"framework {framework.__version__}\ntorch {torch.__version__}\npython {platform.python_version()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="framework", description="A config-driven PyTorch training framework.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("train", help="train: the same as `python train.py [OVERRIDES...]`", add_help=False)
    convert = sub.add_parser("convert", help="export a checkpoint's weights, or import a DeepSpeed checkpoint")
    convert.add_argument("checkpoint", help="a checkpoint directory (or, with --from deepspeed, a DeepSpeed one)")
    convert.add_argument("out", help="the file (export) or directory (import) to write")
    convert.add_argument("--to", choices=["torch", "safetensors"], default="torch", help="export format")
    convert.add_argument("--from", dest="source", choices=["framework", "deepspeed"], default="framework",
                         help="what CHECKPOINT is")
    convert.add_argument("--tag", default=None, help="with --from deepspeed: the tag (default: 'latest')")
    sub.add_parser("version", help="print framework, torch and Python versions")
    if argv[:1] == ["train"]:
        return _train(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "version":
        return _version()
    if args.command == "convert":
        return _convert(args)
    parser.print_help()
    return 0 if args.command is None else 2


if __name__ == "__main__":
    sys.exit(main())
