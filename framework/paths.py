"""Where the framework's own config tree and built-in recipes live.

conf/ and recipes/ sit at the top of the source tree and are installed as the packages
`framework.conf` and `framework.recipes` (setup.py), so the same lookup works in a checkout, an
editable install and a wheel.
"""
from __future__ import annotations

import importlib.resources
import os
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

from framework.errors import ConfigError, did_you_mean


def _package_dir(package: str) -> Path:
    try:
        return Path(str(importlib.resources.files(package)))
    except ModuleNotFoundError as err:
        raise ConfigError(f"cannot find the package {package!r} (the framework's shipped YAML files); "
                          "reinstall the framework: pip install -e . from its source tree") from err


@lru_cache(maxsize=None)
def conf_dir() -> Path:
    """The shipped config tree (`conf/`)."""
    path = _package_dir("framework.conf")
    if not (path / "train.yaml").is_file():
        raise ConfigError(f"the framework's config tree at {path} has no train.yaml; reinstall the framework.")
    return path


@lru_cache(maxsize=None)
def recipes_dir() -> Path:
    """The built-in recipes (`recipes/`)."""
    return _package_dir("framework.recipes")


def builtin_recipes() -> dict[str, Path]:
    """Built-in recipe name -> file."""
    return {p.stem: p for p in sorted(recipes_dir().glob("*.yaml"))}


def builtin_recipe(name: str) -> Path:
    """A built-in recipe by name (`.yaml` optional), or a ConfigError with a did-you-mean."""
    recipes = builtin_recipes()
    stem = name.removesuffix(".yaml")
    if stem in recipes:
        return recipes[stem]
    raise ConfigError(f"no built-in recipe {name!r}.{did_you_mean(stem, recipes, cutoff=0.6)} "
                      f"Built-in recipes: {', '.join(recipes)} (`framework list recipes`).")


def check_creatable_dir(path: Path, key: str, fix: str = "") -> None:
    """Refuse a directory the run could not create or write (a path under a file, a read-only
    file system, a folder without write permission) before anything starts: the nearest existing
    ancestor must be a folder in which a file can really be made (root passes permission bits, a
    read-only mount does not). `fix`: what to do instead (default: another run directory)."""
    path = Path(path).expanduser()
    ancestor = path
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"{key}={path}: cannot be created, because {ancestor} is a file, not a folder; "
                          f"{fix or 'choose another directory (e.g. another name=..., or hydra.run.dir=...)'}.")
    try:
        probe = tempfile.mkdtemp(prefix=".write-test-", dir=ancestor)
        os.rmdir(probe)
    except OSError as err:
        raise ConfigError(f"{key}={path}: cannot be created or written under {ancestor} ({err.strerror}); "
                          f"{fix or 'choose a directory you can write (e.g. hydra.run.dir=... or run from another folder)'}."
                          ) from None


def find_recipe(spec: str) -> Path:
    """A recipe given as a path to a YAML file, or as the name of a built-in recipe."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path.resolve()
    if path.suffix in (".yaml", ".yml") or "/" in spec:
        raise ConfigError(f"recipe {spec}: no such file. Give the path to a recipe YAML, or the name of a "
                          f"built-in recipe: {', '.join(builtin_recipes())} (`framework list recipes`).")
    try:
        return builtin_recipe(spec)
    except ConfigError as err:
        raise ConfigError(f"recipe {spec!r}: no such file, and {err}") from None


def make_importable(folder: Path) -> None:
    """A recipe's own folder is importable (its model, data or task modules beside it), in this
    process and in every process it starts. Appended, so it never shadows an installed package;
    what it may build is still decided by the trust rules."""
    folder = folder.resolve()
    if folder == conf_dir().resolve() or not folder.is_dir():
        return
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(folder) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([*paths, str(folder)])


# The config keys that name files or folders on this machine: made absolute when a run starts, so
# that its config.yaml, recipe.yaml and checkpoints work from any directory (framework test,
# generate and convert of a run directory, moved or not).
PATH_KEYS = ("data.files", "data.val_files", "data.test_files", "data.tokenizer", "data.cache_dir",
             "data.chat_template", "model.pretrained", "model.config_dir", "ckpt_path")
ALWAYS_PATHS = ("data.files", "data.val_files", "data.test_files", "data.cache_dir")  # never a name of something else
_GLOB = set("*?[")


def absolute_path(value: str, base: Path, always: bool = False) -> str:
    """`value` made absolute against `base` where it names something there (a glob pattern whose
    folder exists counts), or `always`; anything else (a hub name, 'bytes', a built-in template's
    name, an inline template) unchanged."""
    text = os.path.expanduser(value)
    if not text or os.path.isabs(text) or "\n" in text:
        return text if text and os.path.isabs(text) else value
    candidate = base / text
    folder = candidate.parent if _GLOB & set(text) else candidate
    return str(candidate) if always or folder.exists() or candidate.exists() else value


def with_absolute_paths(config: dict, base: Path | None = None) -> dict:
    """The resolved config (plain containers) with every PATH_KEYS value absolute (in place)."""
    base = Path(base or os.getcwd())
    for key in PATH_KEYS:
        parent, _, leaf = key.rpartition(".")
        node = config.get(parent) if parent else config
        if not isinstance(node, dict) or not node.get(leaf):
            continue
        value, always = node[leaf], key in ALWAYS_PATHS
        if isinstance(value, str):
            node[leaf] = absolute_path(value, base, always)
        elif isinstance(value, list):
            node[leaf] = [absolute_path(v, base, always) if isinstance(v, str) else v for v in value]
    return config
