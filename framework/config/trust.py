"""Which `_target_` values a config may name. Recipes are code: a `_target_` is imported and
called, so every one is checked against an allow-list before anything is instantiated.

Trusted: the framework and torch (less a few torch entry points that load or compile code),
installed plugin packages (framework/config/entry_points.py: installing one is the user's act of trust),
and the prefixes the user allows from places a recipe cannot write:
- the command line: `trust.allow=[mypkg.,other.module.Class]` (taken out of the overrides before
  Hydra sees them, so a recipe's own `trust:` key is never read; a recipe that has one is refused);
- the environment variable FRAMEWORK_TRUST_ALLOW (comma-separated prefixes);
- a user-level file, ~/.config/framework/trust.yaml (or $FRAMEWORK_TRUST_FILE), holding
  `allow: [mypkg.]`.

A target is resolved, not only matched as text: `framework.some_module.os.system` names a trusted
prefix but reaches `os.system` through a module attribute, so each module passed on the way and
the module that defines the final object must be trusted too.
"""
from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Iterator

from omegaconf import DictConfig, OmegaConf

from framework.config.entry_points import plugin_packages
from framework.config.walk import target_nodes
from framework.errors import ConfigError, did_you_mean

TRUSTED = ("framework.", "torch.")
# Reached through the framework's own Hydra settings (sweepers, launchers, callbacks).
TRUSTED_IN_HYDRA = ("hydra.", "hydra_plugins.", "optuna.samplers.", "optuna.pruners.")
# Inside the trusted prefixes, entry points that load, build or write code or files (and the
# command line and this module): refused unless allowed by name.
DENIED = ("framework.cli.", "framework.config.trust.", "torch.hub.", "torch.load", "torch.save", "torch.serialization.",
          "torch.jit.load", "torch.package.",
          "torch.utils.cpp_extension.", "torch.utils.bottleneck", "torch.utils.collect_env", "torch.distributed.rpc.",
          "torch._dynamo.", "torch._inductor.", "torch.compiler.", "torch.ops.", "torch.classes.")
ENV_ALLOW = "FRAMEWORK_TRUST_ALLOW"
ENV_FILE = "FRAMEWORK_TRUST_FILE"
COMMAND_LINE_KEY = "trust.allow"

HOW_TO_ALLOW = ("If you trust it, allow it from outside the recipe: trust.allow=[{prefix}] on the command line, "
                f"{ENV_ALLOW}={{prefix}} in the environment, or `allow: [{{prefix}}]` in {{file}}.")


def user_file() -> Path:
    if os.environ.get(ENV_FILE):
        return Path(os.environ[ENV_FILE]).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "framework" / "trust.yaml"


def _parse_list(text: str) -> list[str]:
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return [item.strip().strip("'\"") for item in text.split(",") if item.strip().strip("'\"")]


def split_command_line(args: list[str]) -> tuple[list[str], list[str]]:
    """(the other arguments, the prefixes given as trust.allow=[...] / +trust.allow=[...])."""
    rest, allowed = [], []
    for arg in args:
        key, _, value = arg.partition("=")
        if key.lstrip("+") == COMMAND_LINE_KEY:
            allowed += _parse_list(value)
        else:
            rest.append(arg)
    return rest, allowed


def allow_from_command_line(args: list[str]) -> list[str]:
    """Take trust.allow=... out of `args` and hand it to this process and the processes it starts
    (through the environment, which a recipe cannot set: see `check_hydra_settings`)."""
    rest, allowed = split_command_line(args)
    if allowed:
        current = [p for p in os.environ.get(ENV_ALLOW, "").split(",") if p]
        os.environ[ENV_ALLOW] = ",".join(dict.fromkeys([*current, *allowed]))
    return rest


def user_allowed() -> list[str]:
    allowed = [p.strip() for p in os.environ.get(ENV_ALLOW, "").split(",") if p.strip()]
    allowed += [f"{package}." for package in plugin_packages()]  # installed plugins: trusted by installing
    path = user_file()
    if path.is_file():
        stat = path.stat()
        allowed += _allowed_in_file(str(path), stat.st_mtime_ns, stat.st_size)
    return allowed


@lru_cache(maxsize=8)
def _allowed_in_file(path: str, mtime_ns: int, size: int) -> tuple[str, ...]:
    """The user file's `allow` list, read once per version of the file (every build() asks)."""
    try:
        loaded = OmegaConf.to_container(OmegaConf.load(path))
    except Exception as err:
        raise ConfigError(f"{path}: not a readable YAML file ({err}); fix it or remove it.") from err
    items = loaded.get("allow", []) if isinstance(loaded, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ConfigError(f"{path}: must hold `allow: [prefix, ...]` (a list of strings).")
    return tuple(items)


def _matches(name: str, prefix: str) -> bool:
    stem = prefix.rstrip(".")
    return name == stem or name.startswith(stem + ".")


def _trusted_name(name: str, trusted: tuple[str, ...], allowed: list[str]) -> bool:
    if any(_matches(name, p) for p in allowed):
        return True
    if any(_matches(name, d.rstrip(".")) if d.endswith(".") else name == d or name.startswith(d + ".")
           for d in DENIED):
        return False
    return any(_matches(name, p) for p in trusted)


def _resolved_modules(path: str) -> Iterator[str]:
    """The modules a dotted path goes through, and the module defining the object it names.
    Import errors are left to the signature check, which reports them with the key."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        except Exception:  # a module that fails on import is reported by the signature check
            return
        yield obj.__name__
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
            if obj is None:
                return
            if isinstance(obj, type(os)):
                yield obj.__name__
        defining = getattr(obj, "__module__", None)
        if isinstance(defining, str):
            yield defining
        return


def refusal(key: str, target: Any, trusted: tuple[str, ...], allowed: list[str]) -> str | None:
    """Why `target` may not be instantiated, or None when it may."""
    if not isinstance(target, str):
        return None  # a non-string target is reported by the signature check
    why = None
    prefix = target.rsplit(".", 1)[0] + "." if "." in target else target
    if not _trusted_name(target, trusted, allowed):
        missing = _missing_top_module(target)
        if missing is not None:  # a typo: say so before asking the user to trust it
            return missing.format(key=key, target=target)
        why = "is not in the trusted targets (the framework and torch)"
    else:
        for module in _resolved_modules(target):
            if _matches(target, module):
                continue  # a module the target names itself: trusted with it
            if not _trusted_name(module, trusted, allowed):
                why = f"resolves to code in the module '{module}', which is not trusted"
                prefix = module + "."
                break
    if why is None:
        return None
    return (f"{key}._target_={target} {why}; refused before anything was imported or run. "
            + HOW_TO_ALLOW.format(prefix=prefix, file=user_file()))


def _missing_top_module(target: str) -> str | None:
    """A message when the target's top-level module cannot be found at all (looked up without
    importing anything: find_spec of a top-level name runs no code), with the close names."""
    top = target.split(".", 1)[0]
    if not top.isidentifier() or find_spec(top) is not None:
        return None
    names = {m.name for m in pkgutil.iter_modules()} | set(sys.builtin_module_names)
    close = did_you_mean(top, names, cutoff=0.7)
    return ("{key}._target_={target}: no module named '" + top + "' can be found." + close.replace("{", "{{")
            .replace("}", "}}") + " Modules are found beside the recipe, in the current folder's packages and "
            "on PYTHONPATH; fix the name (targets outside the framework and torch must also be trusted).")


def iter_targets(node: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """(full key, target) for every `_target_` in plain containers, lists and nested nodes included."""
    for found, target_node in target_nodes(node, key, skip={"_target_"}):
        yield found or "<root>", target_node["_target_"]


def untrusted(config: Any, prefix: str = "", trusted: tuple[str, ...] = TRUSTED) -> list[str]:
    """One refusal message per untrusted `_target_` in plain containers under `prefix`."""
    allowed = user_allowed()
    return [why for key, target in iter_targets(config, prefix) if (why := refusal(key, target, trusted, allowed))]


def check_trusted(config: Any) -> None:
    """Raise one ConfigError listing every untrusted target of a run's config (without `hydra`)."""
    if isinstance(config, DictConfig):
        config = OmegaConf.to_container(config, resolve=False)
    problems = []
    if isinstance(config, dict) and config.get("trust") is not None:
        problems.append("trust: a recipe cannot extend the trusted targets (it would allow itself); remove the "
                        "key, and allow what you trust from outside the recipe: trust.allow=[...] on the command "
                        f"line, {ENV_ALLOW}, or {user_file()}.")
    problems += untrusted({k: v for k, v in config.items() if k != "hydra"})
    if problems:
        raise ConfigError("\n".join(problems) if len(problems) > 1 else problems[0])


def check_hydra_settings(hydra_node: Any) -> None:
    """The `hydra:` part of a composed config: Hydra instantiates its callbacks, sweeper and
    launcher before the framework runs, and sets the job's environment from it, so it is checked
    before Hydra starts (framework.guard)."""
    if isinstance(hydra_node, DictConfig):
        hydra_node = OmegaConf.to_container(hydra_node, resolve=False)
    problems = untrusted(hydra_node or {}, "hydra", TRUSTED + TRUSTED_IN_HYDRA)
    env_set = ((hydra_node or {}).get("job") or {}).get("env_set") or {}
    for name in env_set:
        if str(name).startswith("FRAMEWORK_TRUST"):
            problems.append(f"hydra.job.env_set.{name}: a recipe cannot set the trust settings (it would allow "
                            "itself); remove it.")
    if problems:
        raise ConfigError("\n".join(problems) if len(problems) > 1 else problems[0])
