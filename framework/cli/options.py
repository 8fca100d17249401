"""A subcommand's own options among Hydra overrides (`framework plan --device cuda strategy=fsdp`):
`--name value` or `--name=value` anywhere on the line, the rest left as overrides."""
from __future__ import annotations

from framework.errors import ConfigError

ALIASES = {"-r": "--recipe"}


def split_options(args: list[str], names: tuple[str, ...], command: str, usage: str) -> tuple[dict[str, str], list[str]]:
    """(the options among `names` (aliases resolved), the overrides)."""
    options, rest, i = {}, [], 0
    while i < len(args):
        name, _, value = args[i].partition("=")
        if name in names:
            if not value:
                if i + 1 >= len(args):
                    raise ConfigError(f"{command} {name}: give it a value. {usage}")
                value, i = args[i + 1], i + 1
            options[ALIASES.get(name, name)] = value
        else:
            rest.append(args[i])
        i += 1
    return options, rest
