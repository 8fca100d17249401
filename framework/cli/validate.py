"""`framework validate RECIPE [OVERRIDES...]`: every problem with a recipe, not just the first.

Composition, schema, values, every `_target_` (trusted, importable, its packages installed, its
arguments matching the callable's signature), the constructors of model/data/task (on the meta
device), and the compatibility table. Nothing is trained and nothing is written.
"""
from __future__ import annotations

import contextlib
import io
import sys

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from framework.errors import ConfigError, UserError, report


def problems_of(cfg) -> list[str]:
    from framework.config.compatibility import check_compatibility
    from framework.config.targets import check_targets
    from framework.config.validate import check_values
    from framework.plugins import build_plugins
    from framework.runner import check_components, compatibility_plan

    problems: list[str] = []

    def collect(step) -> bool:
        try:
            step()
            return True
        except UserError as err:
            problems.extend(str(err).splitlines())
            return False

    try:
        resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "config"
        return [f"{key}: {str(err).splitlines()[0]}"]
    values_ok = collect(lambda: check_values(resolved))
    targets_ok = collect(lambda: check_targets(resolved))
    if not (values_ok and targets_ok):
        return problems  # building plugins from a config that failed these would only repeat them
    built = {}

    def build_all():
        built["plugins"] = build_plugins(resolved)

    plugins_ok = collect(build_all)
    collect(lambda: check_components(resolved))
    if plugins_ok:
        plugins = built["plugins"]

        def compatibility():
            devices = plugins.accelerator.resolve_devices(resolved.devices)
            with contextlib.redirect_stderr(io.StringIO()):
                check_compatibility(compatibility_plan(plugins, resolved, devices))

        collect(compatibility)
    return problems


def main(args: list[str]) -> int:
    from framework.config.compose import compose
    from framework.paths import find_recipe

    if not args or args[0].startswith("-"):
        print("usage: framework validate RECIPE [OVERRIDES...]", file=sys.stderr)
        return 2
    try:
        path = find_recipe(args[0])
        cfg = compose(path.parent, path.stem, args[1:])
    except UserError as err:
        report(err)
        return 2
    problems = problems_of(cfg)
    if problems:
        noun = "problem" if len(problems) == 1 else "problems"
        print(f"{path}: {len(problems)} {noun}", file=sys.stderr)
        report(ConfigError("\n".join(problems)))
        return 2
    print(f"{path}: ok (composition, schema, values, targets, constructors, compatibility)")
    return 0
