"""`framework cp RECIPE DEST`: copy a built-in recipe to edit it (never overwrites)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from framework.errors import ConfigError, ExitCode, UserError, report
from framework.paths import builtin_recipe


def main(args: list[str]) -> int:
    if len(args) != 2:
        print("usage: framework cp RECIPE DEST   (RECIPE: a built-in recipe, `framework list recipes`; "
              "DEST: a file or a folder)", file=sys.stderr)
        return ExitCode.USER_ERROR
    name, dest = args
    try:
        source = builtin_recipe(name)
        target = Path(dest).expanduser()
        if target.is_dir():
            target = target / source.name
        elif target.suffix not in (".yaml", ".yml"):
            target = target.with_suffix(".yaml")
        if target.exists():
            raise ConfigError(f"{target} already exists; choose another DEST (nothing was overwritten).")
        if not target.parent.is_dir():
            raise ConfigError(f"{target.parent}: no such folder; create it first or choose another DEST.")
    except UserError as err:
        report(err)
        return ExitCode.USER_ERROR
    shutil.copyfile(source, target)
    print(f"copied {source.name} to {target}; run it with: framework run {target}")
    return ExitCode.OK
