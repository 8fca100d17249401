"""Command-line overrides that Hydra would misread, rewritten before Hydra parses them.

- The precision options are named like numbers (`precision=16`, `precision=32,bf16`). Hydra's
  override grammar turns a bare `16` into an integer and then refuses it as a group choice, so
  numeric group choices are quoted (`precision='16'`).
- `scheduler=null` is the natural way to say "no scheduler", but Hydra wants `~scheduler` to drop
  a group from the defaults list, and crashes on a null choice; it becomes `~scheduler` (and
  `logger=null` becomes `logger=[]`, the empty choice of a list group).

Only group choices are touched: `trainer.max_steps=16` and `ckpt_path=null` stay as they are.

A sweep (`-m`) gets its name fixed once, when it is launched (`pin_sweep_name`): its jobs may run
in other processes and later (submitit, SLURM), and must all land in the same sweep directory.
"""
from __future__ import annotations

import re
from pathlib import Path

from omegaconf import OmegaConf

from framework.config.groups import GROUPS_WITH_NUMERIC_OPTIONS, LIST_GROUPS
from framework.config.resolvers import job_name
from framework.paths import conf_dir

_NUMBER = re.compile(r"^[0-9]+(\.[0-9]+)?$")
_CHOICE = re.compile(r"^(?P<prefix>[~+]{0,2})(?P<key>[A-Za-z_][\w/]*)=(?P<value>[^\"'()\[\]{}]*)$")


def config_groups() -> set[str]:
    """The group folders of the shipped config tree."""
    return {p.name for p in conf_dir().iterdir() if p.is_dir() and not p.name.startswith("__")}


def normalize_overrides(args: list[str], groups: set[str] | None = None) -> list[str]:
    groups = config_groups() if groups is None else groups
    out = []
    for arg in args:
        match = _CHOICE.match(arg)
        if match:
            group = match["key"].split("/")[-1]
            value = match["value"]
            if group in GROUPS_WITH_NUMERIC_OPTIONS and value:
                items = [f"'{v}'" if _NUMBER.match(v.strip()) else v for v in value.split(",")]
                arg = f"{match['prefix']}{match['key']}={','.join(items)}"
            elif match["key"] in groups and value == "null" and not match["prefix"]:
                arg = f"{match['key']}=[]" if match["key"] in LIST_GROUPS else f"~{match['key']}"
        out.append(arg)
    return out


def pin_sweep_name(args: list[str], config_name: str = "train", root: Path | None = None,
                   recipe_sweeps: bool = False) -> list[str]:
    """With -m/--multirun and no name=..., add name=<the default name, resolved now>. With
    resume=auto and no name, the name of the newest earlier sweep of the same command (same
    recipe, same overrides), so re-running a sweep command with resume=auto continues it.
    `recipe_sweeps`: the recipe itself sets hydra.mode=MULTIRUN (a sweep without -m)."""
    if any(a.lstrip("+").startswith("name=") for a in args):
        return args
    is_sweep = bool({"-m", "--multirun"} & set(args)) or recipe_sweeps
    if "resume=auto" in args and is_sweep:
        previous = previous_sweep_name(args, config_name, root or Path("multirun"))
        if previous:
            return [*args, f"name={previous}"]
    if not {"-m", "--multirun"} & set(args):
        return args  # a recipe that sweeps by itself names its sweep when Hydra starts it
    return [*args, f"name={job_name()}"]


# Overrides that do not change what a run computes: a re-run of a sweep adds resume=auto and keeps
# the name; -m is hydra.mode=MULTIRUN.
NEUTRAL_OVERRIDES = ("-", "name=", "+name=", "resume=", "+resume=", "debug=", "+debug=", "hydra.mode=")


def defining_overrides(overrides) -> list[str]:
    """The overrides that define what a run computes, sorted (to compare two commands)."""
    return sorted(o for o in overrides if not o.startswith(NEUTRAL_OVERRIDES))


def previous_sweep_name(args: list[str], config_name: str, root: Path) -> str | None:
    """The newest sweep under `root` whose recorded command (sweep.yaml, written when a sweep
    starts: framework/sweeps.py) had the same recipe and overrides as `args` (name and resume aside)."""
    if not root.is_dir():
        return None
    wanted = defining_overrides(a for a in args if "=" in a)
    for record_file in sorted(root.rglob("sweep.yaml"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            record = OmegaConf.load(record_file)
            same = record.config_name == config_name and defining_overrides(record.overrides) == wanted
        except Exception:  # an unreadable record is not the sweep we are looking for
            continue
        if same:
            return record_file.parent.relative_to(root).as_posix()
    return None


def recipe_is_a_sweep(config_dir, config_name: str) -> bool:
    """Whether the recipe file itself says hydra.mode: MULTIRUN."""
    if config_dir is None:
        return False
    path = Path(config_dir) / f"{config_name}.yaml"
    try:
        mode = OmegaConf.select(OmegaConf.load(path), "hydra.mode")
    except Exception:  # no such file or not YAML: Hydra reports it
        return False
    return str(mode) == "MULTIRUN"


# Hydra flags after which the command does not train: no pre-check.
NO_PRECHECK_FLAGS = {"--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help", "--resolve",
                     "--package", "-p", "--shell-completion", "-sc", "--experimental-rerun"}
CONFIG_FLAGS = {"--config-dir": "dir", "-cd": "dir", "--config-path": "dir", "-cp": "dir",
                "--config-name": "name", "-cn": "name"}


def split_config_flags(args: list[str], config_dir, config_name: str):
    """(config dir, config name, overrides) from Hydra's command line."""
    overrides, i = [], 0
    while i < len(args):
        flag, _, value = args[i].partition("=")
        if flag in CONFIG_FLAGS:
            if not value:
                i += 1
                value = args[i] if i < len(args) else ""
            if CONFIG_FLAGS[flag] == "dir":
                config_dir = value
            else:
                config_name = value
        elif not args[i].startswith("-"):
            overrides.append(args[i])
        i += 1
    return config_dir, config_name, overrides
