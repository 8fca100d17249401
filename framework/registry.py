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

from fnmatch import fnmatch

from hydra.core.config_store import ConfigStore

from framework.config.entry_points import (  # noqa: F401
    ENTRY_POINT_GROUP,
    PLUGINS_ENTRY_POINT_GROUP,
    REGISTERED,
    Registered,
    load_plugins,
    plugin_conf_dirs,
    plugin_conf_packages,
    plugin_packages,
    registered_options,
)
from framework.config.groups import LIST_GROUPS
from framework.config.targets import SUPPLIED_BY_RUNNER, import_target, parameters
from framework.errors import ConfigError

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


def _target_path(target) -> str:
    if isinstance(target, str):
        return target
    return f"{target.__module__}.{target.__qualname__}"


def register(group: str, name: str, target, *, description: str = "", source: str | None = None,
             **defaults) -> None:
    """Add the option `group=name` building `target` with `defaults` (overridable as usual:
    `group.key=value`). Registering a name twice with different contents is an error."""
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
    callable_ = import_target(target, group) if isinstance(target, str) else target
    found = parameters(callable_)
    if found is None:
        return {}
    supplied = set().union(*(v for pattern, v in SUPPLIED_BY_RUNNER.items() if fnmatch(group, pattern)
                             or fnmatch(f"{group}.x", pattern)))
    return {n: p.default for n, p in found[0].items() if p.default is not p.empty and n not in supplied
            and isinstance(p.default, (type(None), bool, int, float, str))}


def _first_line(target) -> str:
    doc = getattr(target, "__doc__", None) if not isinstance(target, str) else None
    return " ".join((doc or "").split()).split(". ")[0]
