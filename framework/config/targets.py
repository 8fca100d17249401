"""Check every `_target_` node against its callable's signature before anything is built.

An argument the callable does not take, a value of the wrong type, a value outside a declared
bound (`framework.config.types`) or a required argument left out is reported with its full key.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import textwrap
import typing
from fnmatch import fnmatch
from importlib.util import find_spec
from typing import Any, Iterator

from omegaconf import DictConfig, ListConfig, OmegaConf

from framework.config.groups import PLUGIN_GROUPS
from framework.config.trust import check_trusted
from framework.config.types import Bound
from framework.config.walk import target_nodes
from framework.errors import ConfigError, did_you_mean

HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}
# Keys the framework reads itself and removes before instantiation.
RESERVED_KEYS = {"scheduler": {"interval"}}
# Arguments the runner passes at build time (by key pattern), so a YAML need not give them.
SUPPLIED_BY_RUNNER = {
    "strategy": set(PLUGIN_GROUPS) - {"strategy", "fault_tolerance"},  # the strategy receives the other four
    "logger.*": {"save_dir"},
}


def import_target(path: str, key: str):
    """Import `a.b.C` (or `a.b.C.method`) and return it, or raise a ConfigError naming `key`."""
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{key}._target_ must be a dotted import path such as 'torch.optim.AdamW'.")
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and not module_name.startswith(err.name) and err.name != module_name:
                raise ConfigError(
                    f"{key}._target_={path}: importing '{module_name}' needs the package "
                    f"'{err.name}', which is not installed; pip install it, or choose another option."
                ) from err
            continue
        owner = module_name
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                names = [n for n in dir(obj) if not n.startswith("_")]
                if hasattr(obj, "__path__"):  # a package: its submodules count as names too
                    names += [m.name for m in pkgutil.iter_modules(obj.__path__)]
                    what = f"the package '{owner}' has no module or name '{attr}'"
                else:
                    what = f"the module '{owner}' has no '{attr}'"
                raise ConfigError(f"{key}._target_={path}: {what}.{did_you_mean(attr, names)} Check the spelling.")
            obj, owner = getattr(obj, attr), f"{owner}.{attr}"
        return obj
    raise ConfigError(f"{key}._target_={path}: no module '{parts[0]}' can be imported (checked: "
                      f"{'.'.join(parts[:-1]) or parts[0]}). Check the spelling; a module of your own must sit beside "
                      "the recipe (framework run and --config-dir make the recipe's folder importable), be installed, "
                      "or be on PYTHONPATH.")


def iter_target_nodes(cfg: DictConfig) -> Iterator[tuple[str, DictConfig]]:
    """Every `_target_` node in the config with its full key (e.g. 'callbacks.checkpoint')."""
    yield from target_nodes(cfg, "", skip=HYDRA_KEYS | {"hydra"})


def _signature(target) -> inspect.Signature | None:
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def _hints(fn) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception:  # unresolvable forward references: skip type checks, keep key checks
        return {}


def parameters(target) -> tuple[dict[str, inspect.Parameter], dict[str, Any], bool] | None:
    """(parameters, type hints, takes arbitrary keywords) of a callable. For a class whose
    __init__ passes **kwargs up to its base, the base's parameters count too (cooperative init), and
    a class's `keyword_parameters()` ({name: inspect.Parameter}) names keys its **kwargs takes itself."""
    sig = _signature(target)
    if sig is None:
        return None
    if not inspect.isclass(target):
        params = dict(sig.parameters)
        return params, _hints(target), any(p.kind is p.VAR_KEYWORD for p in params.values())
    params: dict[str, inspect.Parameter] = {}
    hints: dict[str, Any] = {}
    fixed: set[str] = set()  # what a subclass passes its base itself: not the user's to give
    for klass in target.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        if klass is object:
            return params, hints, True
        own_sig = _signature(init)
        if own_sig is None:
            return None
        own = own_sig.parameters
        for name, p in list(own.items())[1:]:
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and name not in fixed:
                params.setdefault(name, p)
        for name, hint in _hints(init).items():
            hints.setdefault(name, hint)
        if "keyword_parameters" in klass.__dict__:  # keys its **kwargs takes itself (framework/strategy/mesh/strategy.py)
            for name, p in klass.keyword_parameters().items():
                params.setdefault(name, p)
                hints.setdefault(name, p.annotation)
        fixed |= _passed_to_base(init) - set(own)
        if not any(p.kind is p.VAR_KEYWORD for p in own.values()):
            return params, hints, False
    return params, hints, True


def _passed_to_base(init) -> set[str]:
    """The keyword arguments `init` passes to `super().__init__(...)` by name (read from its source;
    none where there is no source)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    except (OSError, TypeError, SyntaxError):
        return set()
    return {keyword.arg for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr == "__init__"
            and isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "super" for keyword in node.keywords if keyword.arg}


def _type_problem(value, hint) -> str | None:
    """None if `value` fits `hint`, else a short description of what was expected."""
    if hint is Any or value is None and hint is type(None):
        return None
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Annotated:
        base, *meta = args
        problem = _type_problem(value, base)
        if problem:
            return problem
        for m in meta:
            if isinstance(m, Bound) and isinstance(value, (int, float)) and not m.ok(value):
                return f"a number {m.describe()}"
        return None
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        problems = [_type_problem(value, a) for a in args]
        if any(p is None for p in problems):
            return None
        return " or ".join(p for p in problems if p)
    if origin is typing.Literal:
        return None if value in args else "one of " + ", ".join(repr(a) for a in args)
    if value is None:
        return "a value (not null)"
    if origin in (list, tuple, typing.Sequence) or hint in (list, tuple):
        return None if isinstance(value, (list, tuple, ListConfig)) else "a list"
    if origin is dict or hint is dict:
        return None if isinstance(value, (dict, DictConfig)) else "a mapping"
    if hint is bool:
        return None if isinstance(value, bool) else "true or false"
    if hint is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "an integer"
    if hint is float:
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) else "a number"
    if hint is str:
        return None if isinstance(value, str) else "a string"
    if inspect.isclass(hint) and isinstance(value, (str, int, float, bool)):
        # a plain config value can only be an instance of a plain type (a Tensor, say, it is not)
        return None if isinstance(value, hint) else f"a {hint.__name__}"
    return None  # nested configs for class-typed arguments are checked as their own nodes


def missing_packages(target) -> dict[str, str]:
    """The packages a plugin class declares in `requires_packages` ({module: pip install argument})
    that are not installed. Checked without importing them (they are imported only when used)."""
    missing = {}
    for module, install in dict(getattr(target, "requires_packages", None) or {}).items():
        try:
            found = find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing[module] = install
    return missing


def _check_node(key: str, node: DictConfig, problems: list[str]) -> None:
    try:
        target = import_target(node["_target_"], key)
    except ConfigError as err:
        problems.append(str(err))
        return
    for module, install in missing_packages(target).items():
        problems.append(f"{key}: '{node['_target_']}' needs the package '{module}', which is not installed; "
                        f"pip install {install}, or choose another option.")
    found = parameters(target)
    if found is None:
        return
    params, hints, takes_kwargs = found
    given = [k for k in node.keys() if k not in HYDRA_KEYS and k not in RESERVED_KEYS.get(key, ())]
    for arg in given:
        if arg not in params and not takes_kwargs:
            valid = [n for n, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
            swapped = (f" If a recipe sets it for another {key} option, drop it with ~{key}.{arg} on the command "
                       "line." if "." not in key else "")
            problems.append(
                f"{key}.{arg}: '{node['_target_']}' takes no argument '{arg}'.{did_you_mean(arg, valid, 0.7)} "
                f"It takes: {', '.join(valid) or 'none'}.{swapped}"
            )
            continue
        if arg in hints and not OmegaConf.is_missing(node, arg):
            value = node[arg]
            problem = _type_problem(value, hints[arg])
            if problem:
                problems.append(f"{key}.{arg}={value!r}: must be {problem}.")
    if node.get("_partial_", False):
        return
    supplied = set().union(*(v for pattern, v in SUPPLIED_BY_RUNNER.items() if fnmatch(key, pattern)))
    for name, p in params.items():
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) or p.default is not p.empty:
            continue
        if name not in given and name not in supplied:
            problems.append(f"{key}.{name}: required by '{node['_target_']}' but not given; add {key}.{name}=...")


def check_targets(cfg: DictConfig) -> None:
    """Raise one ConfigError listing every problem with every `_target_` node. Untrusted targets
    are refused first, before any target is imported (framework/config/trust.py)."""
    check_trusted(cfg)
    problems: list[str] = []
    for key, node in iter_target_nodes(cfg):
        _check_node(key, node, problems)
    if problems:
        raise ConfigError("\n".join(problems) if len(problems) > 1 else problems[0])
