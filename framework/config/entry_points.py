"""Installed plugin packages, found by their entry points (nothing of theirs imported until asked).

Two entry point groups: `framework.conf` (a package's config tree: Hydra finds its options
through hydra_plugins/framework_searchpath) and `framework.plugins` (a module that registers
options from code with `framework.registry.register`). This module is the discovery half of
the registry; it sits on the config floor so composing and trust checks can read it.
"""
from __future__ import annotations

import importlib
import importlib.resources
import sys
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
    dirs: dict[str, Path] = {}
    for dist, package in plugin_conf_packages().items():
        try:
            dirs[dist] = Path(str(importlib.resources.files(package)))
        except (ModuleNotFoundError, TypeError):
            continue
    return dirs


PLUGINS_ENTRY_POINT_GROUP = "framework.plugins"


@dataclass(frozen=True)
class Registered:
    group: str
    name: str
    target: str
    defaults: dict
    source: str
    description: str


REGISTERED: dict[tuple[str, str], Registered] = {}


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
