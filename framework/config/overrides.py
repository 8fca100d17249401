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

GROUPS_WITH_NUMERIC_OPTIONS = ("precision",)
LIST_GROUPS = ("logger", "callbacks")  # chosen as lists; "none" is the empty list
_NUMBER = re.compile(r"^[0-9]+(\.[0-9]+)?$")
_CHOICE = re.compile(r"^(?P<prefix>[~+]{0,2})(?P<key>[A-Za-z_][\w/]*)=(?P<value>[^\"'()\[\]{}]*)$")


def config_groups() -> set[str]:
    """The group folders of the shipped config tree."""
    root = Path(__file__).resolve().parents[2] / "conf"
    return {p.name for p in root.iterdir() if p.is_dir()} if root.is_dir() else set()


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


def pin_sweep_name(args: list[str]) -> list[str]:
    """With -m/--multirun and no name=..., add name=<the default name, resolved now>."""
    if not {"-m", "--multirun"} & set(args) or any(a.lstrip("+").startswith("name=") for a in args):
        return args
    from framework.config.resolvers import job_name

    return [*args, f"name={job_name()}"]
