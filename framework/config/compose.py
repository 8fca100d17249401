"""Compose a config the way `train.py` does, turning Hydra's errors into one clear paragraph.

`framework plan/validate/list` compose through here, and `framework.guard` composes once through
here before Hydra runs, so a mistyped option gets a did-you-mean instead of Hydra's raw message.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from framework.config.entry_points import plugin_conf_dirs, registered_options
from framework.config.overrides import normalize_overrides
from framework.config.trust import allow_from_command_line
from framework.errors import ConfigError, did_you_mean
from framework.paths import conf_dir, make_importable


def group_options(group: str, search_dirs: list[Path]) -> list[str]:
    """Options of a config group found in the given config directories (the shipped tree and a
    recipe's own folder) plus the ones installed plugin packages register."""
    options: set[str] = set()
    for root in search_dirs:
        folder = Path(root) / group
        if folder.is_dir():
            options.update(p.stem for p in folder.glob("*.yaml"))
    options.update(registered_options(group))
    for root in plugin_conf_dirs().values():
        folder = root / group
        if folder.is_dir():
            options.update(p.stem for p in folder.glob("*.yaml"))
    return sorted(options)


def options_with_key(group: str, key: str, search_dirs: list[Path]) -> list[str]:
    """The options of config group `group` whose YAML sets `key` at its top level."""
    owners = []
    for root in search_dirs:
        for path in sorted((Path(root) / group).glob("*.yaml")) if (Path(root) / group).is_dir() else []:
            try:
                node = OmegaConf.load(path)
            except Exception:  # a file that does not load is not this message's business
                continue
            if isinstance(node, DictConfig) and key in node and path.stem not in owners:
                owners.append(path.stem)
    return owners


def friendly_message(err: Exception, search_dirs: list[Path], cfg_keys=None) -> str:
    """One paragraph for a Hydra composition error, naming the key and the fix."""
    text = str(err)
    missing = re.search(r"Could not (?:find|load) '([\w/]+)/([^'/]+)'", text)
    if missing:
        group, option = missing.group(1), missing.group(2)
        options = group_options(group, search_dirs)
        return (f"{group}={option}: no such option.{did_you_mean(option, options)} "
                f"Options of {group}: {', '.join(options) or 'none'} (`framework list {group}`).")
    missing_config = re.search(r"Cannot find primary config '([^']+)'", text)
    if missing_config:
        return f"no recipe named {missing_config.group(1)!r} in the config directory; check the name and --config-dir."
    unknown = re.search(r"Could not override '([\w.]+)'", text)
    causes = [err.__cause__, getattr(err.__cause__, "__cause__", None)]
    nested = re.search(r"full_key: ([\w.]+)", " ".join(str(c) for c in causes if c is not None))
    if unknown and nested and nested.group(1) != unknown.group(1):
        # a dict value (key={a: 1, b: 2}) merges into the existing node: name the key it lacks
        key = nested.group(1)
        return (f"{key}: no such key (from the value given to {unknown.group(1)}, which is merged into its "
                f"existing keys). Add it with +{key}=..., or replace the whole node: ~{unknown.group(1)} "
                f"+{unknown.group(1)}={{...}}.")
    if unknown:
        key = unknown.group(1)
        parent, _, leaf = key.rpartition(".")
        hint = ""
        owners = options_with_key(parent, leaf, search_dirs) if parent and "." not in parent else []
        if owners:  # a key of another option of the group (data.streaming is data=text_files's)
            hint = (f" It is a key of {', '.join(f'{parent}={o}' for o in owners)}, not of the {parent} option "
                    "chosen; choose that option, or leave the key out.")
        elif cfg_keys is not None:
            hint = did_you_mean(leaf, cfg_keys(parent, key))
        return (f"{key}: no such key.{hint} To add a new key on purpose, write +{key}=...; "
                f"`python train.py --cfg job` prints every key.")
    cause = err.__cause__
    if "Error merging override" in text and cause is not None:
        detail = str(cause).splitlines()[0].rstrip(".")
        override = text.removeprefix("Error merging override").strip()
        return (f"{override}: {detail}. Give a value of the key's type (`python train.py --cfg job` shows every "
                "key with its current value).")
    if type(err).__name__ == "OverrideParseException":
        lines = [line for line in text.splitlines() if line and not line.startswith("See https")]
        return ("bad override syntax: " + "; ".join(lines) + ". Overrides are key=value, group=option, "
                "+new_key=value or ~key (quote values holding spaces, brackets or '=').")
    return text.splitlines()[0] if text else type(err).__name__


def keys_lookup(compose_choices, overrides: list[str]):
    """`keys_at(parent, failing_key)` for friendly_message: the keys under `parent` in the config
    composed with only the other group choices of `overrides` (`compose_choices(choices)`)."""
    def keys_at(parent: str, failing_key: str) -> list[str]:
        try:
            choices = [o for o in overrides if "=" in o and "." not in o.split("=")[0]
                       and o.split("=")[0].lstrip("+~") != failing_key]
            base = compose_choices(choices)
            node = OmegaConf.select(base, parent) if parent else base
        except Exception:
            return []
        return [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []

    return keys_at


def search_dirs_of(config_dir) -> list[Path]:
    """Where group options are looked for: the primary config's folder, then the shipped tree."""
    return [Path(config_dir), conf_dir()] if config_dir else [conf_dir()]


@contextmanager
def composer(config_dir: Path):
    """Yields `compose(config_name, overrides)` for many compositions under one Hydra
    initialization (`framework list` composes one config per option)."""
    search_dirs = search_dirs_of(config_dir)
    GlobalHydra.instance().clear()

    def compose_one(config_name: str, overrides: list[str], with_hydra: bool = False) -> DictConfig:
        overrides = normalize_overrides(list(overrides))
        try:
            return hydra_compose(config_name, overrides=overrides, return_hydra_config=with_hydra)
        except Exception as err:  # Hydra has no common base class for composition errors
            keys_at = keys_lookup(lambda choices: hydra_compose(config_name, overrides=choices), overrides)
            raise ConfigError(friendly_message(err, search_dirs, keys_at)) from err

    try:
        with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base=None):
            yield compose_one
    finally:
        GlobalHydra.instance().clear()


def compose(config_dir: Path, config_name: str, overrides: list[str], with_hydra: bool = False) -> DictConfig:
    """The composed config (with the `hydra` node only if asked), or a ConfigError. Untrusted
    command-line prefixes (trust.allow=...) are taken out of `overrides` and applied first."""
    overrides = allow_from_command_line(list(overrides))
    make_importable(Path(config_dir))  # user code beside a recipe: as `framework run` and train.py find it
    with composer(config_dir) as compose_one:
        return compose_one(config_name, overrides, with_hydra)


def sweep_variants(overrides: list[str], limit: int = 16) -> list[list[str]]:
    """Override lists that between them use every value of every swept key (`lr=1e-3,3e-3` ->
    one list per value, the other swept keys at their first value), so a sweep is checked before
    any job runs without composing its whole product. Sweeps without listed values (Optuna's
    interval(...)) are left out."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    fixed: list[str] = []
    swept: list[tuple[str, list[str]]] = []
    for override, text in zip(parsed, overrides):
        if not override.is_sweep_override():
            fixed.append(text)
            continue
        try:
            values = list(override.sweep_string_iterator())[:limit]
        except Exception:
            continue
        if values:
            swept.append((override.get_key_element(), values))
    first = [f"{key}={values[0]}" for key, values in swept]
    variants = [fixed + first]
    for i, (key, values) in enumerate(swept):
        for value in values[1:]:
            variants.append(fixed + first[:i] + [f"{key}={value}"] + first[i + 1:])
    return variants
