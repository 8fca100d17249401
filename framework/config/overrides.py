"""Command-line overrides that Hydra would misread.

The precision options are named like numbers (`precision=16`, `precision=32,bf16`), and Hydra's
override grammar turns a bare `16` into an integer, which it then refuses as a config-group
choice. Quoting such values (`precision='16'`) before Hydra parses them lets users type the names
as documented. Only group choices are touched; `trainer.max_steps=16` stays an integer.
"""
from __future__ import annotations

import re

GROUPS_WITH_NUMERIC_OPTIONS = ("precision",)
_NUMBER = re.compile(r"^[0-9]+(\.[0-9]+)?$")
_CHOICE = re.compile(r"^(?P<prefix>[~+]{0,2})(?P<key>[A-Za-z_][\w/]*)=(?P<value>[^\"'()\[\]{}]*)$")


def quote_numeric_choices(args: list[str]) -> list[str]:
    out = []
    for arg in args:
        match = _CHOICE.match(arg)
        if match and match["key"].split("/")[-1] in GROUPS_WITH_NUMERIC_OPTIONS and match["value"]:
            items = [f"'{v}'" if _NUMBER.match(v.strip()) else v for v in match["value"].split(",")]
            arg = f"{match['prefix']}{match['key']}={','.join(items)}"
        out.append(arg)
    return out
