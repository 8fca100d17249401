"""Config trees that installed plugin packages add to the framework.

A package declares, in its pyproject.toml,

    [project.entry-points."framework.conf"]
    my_plugin = "my_plugin.conf"

where `my_plugin/conf/` holds group folders (`strategy/my_strategy.yaml`, ...). Hydra then finds
those options like the built-in ones (hydra_plugins/framework_searchpath appends each package to
the search path), so `python train.py strategy=my_strategy` works after `pip install my-plugin`,
and `framework list` shows the option with the package it came from.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path

ENTRY_POINT_GROUP = "framework.conf"


@lru_cache(maxsize=None)
def plugin_conf_packages() -> dict[str, str]:
    """Distribution name -> the importable package holding its config tree."""
    found: dict[str, str] = {}
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = entry.dist.name if entry.dist is not None else entry.name
        found[dist] = entry.value
    return found


@lru_cache(maxsize=None)
def plugin_conf_dirs() -> dict[str, Path]:
    """Distribution name -> the folder of its config tree (packages that fail to import are skipped
    here; `framework list` reports them)."""
    import importlib.resources

    dirs: dict[str, Path] = {}
    for dist, package in plugin_conf_packages().items():
        try:
            dirs[dist] = Path(str(importlib.resources.files(package)))
        except (ModuleNotFoundError, TypeError):
            continue
    return dirs


# ---- options registered from code --------------------------------------------------------------
# A plugin package may also register options from Python, with extra default arguments (like
# Lightning's StrategyRegistry.register(name, cls, **kwargs)), in a module it names under the
# entry point group below; the framework imports those modules before composing a config.
#
#     [project.entry-points."framework.plugins"]
#     my_plugin = "my_plugin.register"
#
#     # my_plugin/register.py
#     from framework.registry import register
#     register("strategy", "ddp_small_buckets", "my_plugin.strategy.MyDDP", bucket_cap_mb=1)

PLUGINS_ENTRY_POINT_GROUP = "framework.plugins"
LIST_GROUPS = ("logger", "callbacks")  # options of these are keyed by their own name


@dataclass(frozen=True)
class Registered:
    group: str
    name: str
    target: str
    defaults: dict
    source: str
    description: str


REGISTERED: dict[tuple[str, str], Registered] = {}


def _target_path(target) -> str:
    if isinstance(target, str):
        return target
    return f"{target.__module__}.{target.__qualname__}"


def register(group: str, name: str, target, *, description: str = "", source: str | None = None,
             **defaults) -> None:
    """Add the option `group=name` building `target` with `defaults` (overridable as usual:
    `group.key=value`). Registering a name twice with different contents is an error."""
    from hydra.core.config_store import ConfigStore

    from framework.errors import ConfigError

    path = _target_path(target)
    defaults = {**_signature_defaults(target, group), **defaults}
    entry = Registered(group, name, path, dict(defaults), source or path.split(".")[0],
                       description or _first_line(target))
    existing = REGISTERED.get((group, name))
    if existing is not None and existing != entry:
        raise ConfigError(f"{group}={name} is registered twice ({existing.target} from {existing.source}, "
                          f"{path} from {entry.source}); rename one of them.")
    node = {"_target_": path, **defaults}
    ConfigStore.instance().store(group=group, name=name, node={name: node} if group in LIST_GROUPS else node,
                                 provider=entry.source)
    REGISTERED[(group, name)] = entry


def _signature_defaults(target, group: str) -> dict:
    """The callable's plain keyword defaults, so every argument is overridable (`group.key=...`)
    as with an option written in YAML; arguments the runner passes itself are left out."""
    from fnmatch import fnmatch

    from framework.config.targets import SUPPLIED_BY_RUNNER, _parameters, import_target

    callable_ = import_target(target, group) if isinstance(target, str) else target
    found = _parameters(callable_)
    if found is None:
        return {}
    supplied = set().union(*(v for pattern, v in SUPPLIED_BY_RUNNER.items() if fnmatch(group, pattern)
                             or fnmatch(f"{group}.x", pattern)))
    return {n: p.default for n, p in found[0].items() if p.default is not p.empty and n not in supplied
            and isinstance(p.default, (type(None), bool, int, float, str))}


def _first_line(target) -> str:
    doc = getattr(target, "__doc__", None) if not isinstance(target, str) else None
    return " ".join((doc or "").split()).split(". ")[0]


def registered_options(group: str) -> list[str]:
    load_plugins()
    return sorted(name for (g, name) in REGISTERED if g == group)


_loaded = False


def load_plugins() -> None:
    """Import every installed package's registration module (once). A module that fails to
    import is reported, not fatal: the rest of the framework stays usable."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib
    import sys

    for entry in metadata.entry_points(group=PLUGINS_ENTRY_POINT_GROUP):
        try:
            importlib.import_module(entry.value)
        except Exception as err:  # a broken plugin must not break every command
            print(f"warning: plugin {entry.name} ({entry.value}) failed to load: {type(err).__name__}: {err}",
                  file=sys.stderr)


@lru_cache(maxsize=None)
def plugin_packages() -> tuple[str, ...]:
    """Top-level packages of installed plugins (both entry point groups). Installing a plugin is
    the user's act of trust, so their targets are trusted like the framework's own."""
    names = set()
    for group in (ENTRY_POINT_GROUP, PLUGINS_ENTRY_POINT_GROUP):
        for entry in metadata.entry_points(group=group):
            names.add(entry.value.split(".")[0].split(":")[0])
    return tuple(sorted(names))
