"""`framework list [GROUP]`: every option of every config group, what it is, and whether it can
run on this machine.

The description is the first comment of the option's YAML (else its target's docstring). For the
five plugin groups, "usable" means the default config with that option passes the same checks a
run does (targets, packages, the compatibility table); for the others, that its targets import
and the packages they declare are installed.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from omegaconf import OmegaConf

from framework.config.compose import composer
from framework.config.entry_points import REGISTERED, load_plugins, plugin_conf_dirs
from framework.config.groups import PLUGIN_GROUPS
from framework.config.targets import import_target, iter_target_nodes, missing_packages
from framework.config.yaml_comments import yaml_description
from framework.errors import ConfigError, ExitCode, UserError, did_you_mean, report
from framework.paths import builtin_recipes, conf_dir
from framework.preflight import prepare


@dataclass
class Option:
    group: str
    name: str
    path: Path | None  # None for an option registered from code (framework.registry.register)
    source: str
    description: str = ""
    problem: str | None = None  # why it cannot run here; None when it can
    note: str = ""  # e.g. a warning it would print, or "detected" for a cluster


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def discover(groups: list[str] | None = None) -> list[Option]:
    """Options of the shipped tree and of installed plugin packages, by group (nested groups
    such as hydra/launcher included), plus the built-in recipes as the group 'recipes'."""

    roots = [("framework", conf_dir()), *plugin_conf_dirs().items()]
    options: list[Option] = []
    for source, root in roots:
        for path in sorted(root.rglob("*.yaml")):
            group = path.parent.relative_to(root).as_posix()
            if group == "." or (groups and group not in groups):
                continue
            options.append(Option(group, path.stem, path, source, yaml_description(path)))

    load_plugins()
    for (group, name), entry in sorted(REGISTERED.items()):
        if not groups or group in groups:
            options.append(Option(group, name, None, entry.source, entry.description))
    if not groups or "recipes" in groups:
        for name, path in builtin_recipes().items():
            options.append(Option("recipes", name, path, "framework", yaml_description(path)))
    return options


def _check_yaml_targets(option: Option) -> None:
    if option.path is None:
        node = OmegaConf.create({"_target_": REGISTERED[option.group, option.name].target})
    else:
        node = OmegaConf.load(option.path)
    for key, target_node in iter_target_nodes(node):
        try:
            target = import_target(target_node["_target_"], key or option.group)
        except ConfigError as err:
            option.problem = str(err)
            return
        missing = missing_packages(target)
        if missing:
            module, install = next(iter(missing.items()))
            option.problem = f"needs the package '{module}' (pip install {install})"
            return
        if not option.description and target.__doc__:
            option.description = _first_sentence(target.__doc__)


def _check_sweeper(option: Option) -> None:
    if option.group == "hparams_search" and find_spec("hydra_plugins.hydra_optuna_sweeper") is None:
        option.problem = "needs the package 'hydra-optuna-sweeper' (pip install 'framework[optuna]')"
    elif option.group == "hydra/launcher" and find_spec("hydra_plugins.hydra_submitit_launcher") is None:
        option.problem = "needs the package 'hydra-submitit-launcher' (pip install 'framework[submitit]')"


def _check_plugin(option: Option, compose_one) -> None:
    """The default config with this option, through the checks a run makes before launching."""

    try:
        cfg = compose_one("train", [f"{option.group}={option.name}"])
        prepared = prepare(cfg)
    except UserError as err:
        option.problem = str(err).splitlines()[0]
        return
    except Exception as err:  # a plugin that fails in an unexpected way is not usable either
        option.problem = f"{type(err).__name__}: {err}"
        return
    if prepared.warnings:
        option.note = prepared.warnings[0]
    if option.group == "cluster" and option.name not in ("auto", "local"):
        option.note = "detected" if type(prepared.plugins.cluster).detect() else "not detected here"
    if not option.description:
        target = type(getattr(prepared.plugins, option.group))
        option.description = _first_sentence(target.__doc__ or "")


def check_usable(options: list[Option]) -> None:
    with composer(conf_dir()) as compose_one:
        for option in options:
            if option.group in PLUGIN_GROUPS:
                _check_plugin(option, compose_one)
            elif option.group in ("hparams_search", "hydra/launcher"):
                _check_sweeper(option)
            elif option.group != "recipes":
                _check_yaml_targets(option)


def render(options: list[Option], stream=None) -> None:
    stream = stream or sys.stdout
    width = max((len(o.name) for o in options), default=10) + 2
    group = None
    for option in sorted(options, key=lambda o: (o.group, o.name)):
        if option.group != group:
            group = option.group
            print(f"\n{group}", file=stream)
        usable = "yes" if option.problem is None else "no "
        source = "" if option.source == "framework" else f" [from {option.source}]"
        print(f"  {option.name:<{width}}{usable}  {option.description}{source}", file=stream)
        if option.problem:
            print(f"  {'':<{width}}     not usable here: {option.problem}", file=stream)
        elif option.note:
            print(f"  {'':<{width}}     note: {option.note}", file=stream)


def main(groups: list[str]) -> int:
    options = discover(groups or None)
    if groups:
        known = {o.group for o in discover()}
        unknown = [g for g in groups if g not in known]
        if unknown:
            hints = [f"{g}.{did_you_mean(g, known)}" for g in unknown]
            report(ConfigError(f"no config group {' '.join(hints)} Groups: {', '.join(sorted(known))}."))
            return ExitCode.USER_ERROR
    check_usable(options)
    print("option usable here, description (`python train.py GROUP=OPTION`; recipes: `framework run NAME`)")
    render(options)
    return ExitCode.OK
