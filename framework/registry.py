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
