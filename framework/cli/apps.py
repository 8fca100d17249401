"""`framework train` and `framework run RECIPE`: the Hydra app of train.py on any config."""
from __future__ import annotations

import sys
from pathlib import Path

import hydra

from framework.entry_guard import guard
from framework.errors import ExitCode, UserError, report
from framework.paths import conf_dir, find_recipe
from framework.runner import run


def run_hydra_app(config_dir: Path, config_name: str, args: list[str]) -> int:
    """Exactly what `python train.py ARGS` does, with `config_dir/config_name.yaml` as the primary
    config (the shipped groups come from the search path: hydra_plugins/framework_searchpath)."""
    @hydra.main(version_base=None, config_path=str(Path(config_dir).resolve()), config_name=config_name)
    def main(cfg):
        return run(cfg)

    sys.argv = [f"{config_name}.py", *args]
    guard(main, config_dir, config_name)
    return ExitCode.OK


def train(args: list[str]) -> int:
    return run_hydra_app(conf_dir(), "train", args)


def run_recipe(args: list[str]) -> int:
    """`framework run RECIPE [OVERRIDES...]`: RECIPE is a YAML file anywhere, or a built-in name."""
    if not args or args[0].startswith("-"):
        print("usage: framework run RECIPE [OVERRIDES...]   (RECIPE: a YAML file or a built-in recipe name;"
              " `framework list recipes`)", file=sys.stderr)
        return ExitCode.USER_ERROR
    try:
        recipe = find_recipe(args[0])
    except UserError as err:
        report(err)
        return ExitCode.USER_ERROR
    return run_hydra_app(recipe.parent, recipe.stem, args[1:])
