"""The `framework` command (also `python -m framework`).

    framework train [OVERRIDES...]   the same as `python train.py [OVERRIDES...]`
    framework version                framework, torch and Python versions
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
    sub.add_parser("version", help="print framework, torch and Python versions")
    if argv[:1] == ["train"]:
        return _train(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "version":
        return _version()
    parser.print_help()
    return 0 if args.command is None else 2


if __name__ == "__main__":
    sys.exit(main())
