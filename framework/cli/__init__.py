"""The `framework` command (also `python -m framework`).

    framework train [OVERRIDES...]        the same as `python train.py [OVERRIDES...]`
    framework run RECIPE [OVERRIDES...]   train a recipe: a YAML file anywhere, or a built-in name
    framework list [GROUP...]             every option of every group, and whether it runs here
    framework plan [-r RECIPE] [OVERRIDES...]   plugins, world, model size, memory per rank; no training
    framework validate RECIPE [OVERRIDES...]    every problem with a recipe, not just the first
    framework prepare-data [-r RECIPE] [OVERRIDES...]   tokenise a run's data into its store now
    framework test RUN_DIR|CHECKPOINT [OVERRIDES...]   a checkpoint's scores on the data's test split
    framework predict RUN_DIR|CHECKPOINT [OVERRIDES...] -o FILE  one row per sample of a split
    framework generate RUN_DIR|CHECKPOINT|HF_DIR --prompt TEXT   text from a trained language model
    framework eval RUN_DIR|CHECKPOINT|HF_DIR --tasks NAMES   benchmarks through lm-evaluation-harness
    framework cp RECIPE DEST              copy a built-in recipe to edit it
    framework convert CKPT --to torch OUT.pt    model weights as a plain state_dict (or safetensors)
    framework convert DS_DIR --from deepspeed OUT_DIR   a DeepSpeed native checkpoint, imported
    framework plot DIR [DIR...]           PNG figures of runs (overlaid) or of a sweep
    framework lighthouse [--port P]       a torchft lighthouse for replica groups started separately
    framework version                     framework, torch and Python versions
"""
from __future__ import annotations

import argparse
import importlib
import sys

from framework.errors import ExitCode
from framework.version import versions


def _version() -> int:
    print("\n".join(f"{name} {version}" for name, version in versions(optional=True).items()))
    return ExitCode.OK


# Each command lives in its own module, imported only when it runs (so `framework --help` is fast),
# and parses its own arguments (Hydra overrides pass through untouched: argparse would eat them).
PASS_THROUGH = {
    "train": ("train with the shipped config: the same as `python train.py [OVERRIDES...]`", "apps", "train"),
    "run": ("train a recipe: `framework run RECIPE [OVERRIDES...]` (a YAML file anywhere, or a built-in name)",
            "apps", "run_recipe"),
    "list": ("every option of every config group, and whether it can run here: `framework list [GROUP...]`",
             "list_options", "main"),
    "plan": ("what a run would be (plugins, world, model size, memory per rank) without training: "
             "`framework plan [-r RECIPE] [OVERRIDES...]`", "plan", "main"),
    "validate": ("every problem with a recipe: `framework validate RECIPE [OVERRIDES...]`", "validate", "main"),
    "prepare-data": ("tokenise a run's data into its store now, with progress, for every later run: "
                     "`framework prepare-data [-r RECIPE] [OVERRIDES...]`", "prepare_data", "main"),
    "test": ("score a run's best checkpoint (or a given one) on the data's test split: "
             "`framework test RUN_DIR|CHECKPOINT [OVERRIDES...]`", "test", "main"),
    "predict": ("one row per sample with what the task predicts: `framework predict RUN_DIR|CHECKPOINT "
                "[OVERRIDES...] -o predictions.jsonl|.parquet [--split test|val|train]`", "predict", "main"),
    "generate": ("text from a trained language model: `framework generate RUN_DIR|CHECKPOINT|HF_DIR --prompt TEXT "
                 "[--temperature T] [--top-k K] [--top-p P] [--seed S] [--max-new-tokens N]`", "generate", "main"),
    "eval": ("benchmarks through EleutherAI's lm-evaluation-harness: `framework eval RUN_DIR|CHECKPOINT|HF_DIR "
             "--tasks NAMES [--include-path DIR] [--limit N] [--num-fewshot K] [--batch-size B]`", "eval", "main"),
    "cp": ("copy a built-in recipe to edit it: `framework cp RECIPE DEST`", "copy_recipe", "main"),
    "convert": ("export a checkpoint's weights, or import a DeepSpeed checkpoint: "
                "`framework convert CKPT OUT [--to torch|safetensors] [--from framework|deepspeed]`", "convert", "main"),
    "plot": ("PNG figures of runs (overlaid) or of a sweep: `framework plot DIR [DIR...] [-o FILE]`", "plot", "main"),
    "lighthouse": ("a torchft lighthouse for replica groups started separately (fault_tolerance=torchft): "
                   "`framework lighthouse [--port P] [--min-replicas N]`", "lighthouse", "main"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="framework", description="A config-driven PyTorch training framework.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, _, _) in PASS_THROUGH.items():
        sub.add_parser(name, help=help_text, add_help=False)
    sub.add_parser("version", help="print framework, torch and Python versions")
    if argv[:1] and argv[0] in PASS_THROUGH:
        if argv[1:2] in (["-h"], ["--help"]) and argv[0] not in ("train", "run", "convert", "plot", "test", "generate", "predict", "eval",
                                                           "lighthouse"):
            print(f"framework {argv[0]}: {PASS_THROUGH[argv[0]][0]}")
            return ExitCode.OK
        _, module, function = PASS_THROUGH[argv[0]]
        return getattr(importlib.import_module(f"framework.cli.{module}"), function)(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "version":
        return _version()
    parser.print_help()
    return ExitCode.OK if args.command is None else ExitCode.USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
