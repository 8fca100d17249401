"""`framework validate RECIPE [OVERRIDES...]`: every problem with a recipe, not just the first.

Composition, schema, values, every `_target_` (trusted, importable, its packages installed, its
arguments matching the callable's signature), the constructors of model/data/task (on the meta
device), and the compatibility table. Nothing is trained and nothing is written.
"""
from __future__ import annotations

import sys

from framework.config.compose import compose
from framework.console import warn
from framework.errors import ConfigError, ExitCode, UserError, report
from framework.paths import find_recipe
from framework.preflight import prepare


def problems_of(cfg) -> list[str]:
    """Every problem the run's own preparation finds (framework.preflight.prepare)."""
    return prepare(cfg, strict=False).problems


def main(args: list[str]) -> int:
    if not args or args[0].startswith("-"):
        print("usage: framework validate RECIPE [OVERRIDES...]", file=sys.stderr)
        return ExitCode.USER_ERROR
    try:
        path = find_recipe(args[0])
        cfg = compose(path.parent, path.stem, args[1:])
    except UserError as err:
        report(err)
        return ExitCode.USER_ERROR
    prepared = prepare(cfg, strict=False)
    problems = prepared.problems
    for warning in prepared.warnings:
        warn(warning)
    if problems:
        noun = "problem" if len(problems) == 1 else "problems"
        print(f"{path}: {len(problems)} {noun}", file=sys.stderr)
        report(ConfigError("\n".join(problems)))
        return ExitCode.USER_ERROR
    print(f"{path}: ok (composition, schema, values, targets, constructors, data sources, compatibility)")
    return ExitCode.OK
