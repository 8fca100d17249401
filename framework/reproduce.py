"""`recipe.yaml` in every run directory: a standalone recipe that reproduces the run.

It is the resolved config (every plugin's `_target_` and arguments spelled out, no defaults
list to chase) under a header recording the versions and the source commit it ran with. Run it
again, from anywhere, with `framework run <run dir>/recipe.yaml`; it trains a fresh run (its
own name, no resume) with the same numbers.
"""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from framework.paths import conf_dir
from framework.version import versions

# Keys that say where a run continues from, not what it computes: a reproduction starts fresh.
FRESH_RUN = {"ckpt_path": None, "resume": None, "name": "${job_name:}"}


def source_commit() -> str | None:
    """The git commit of the framework's source tree (with '-dirty' when it has local changes),
    or None for an installed wheel or a tree without git."""
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return None
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")


def header(name: str) -> str:
    found = [f"{name} {version}" for name, version in versions(optional=True).items()]
    lines = [
        f"# Reproduces run '{name}' (written by the framework; edit freely).",
        f"# Versions: {', '.join(found)}",
        f"# Source: git {source_commit() or 'commit unknown (not a git checkout)'}",
        f"# Command: {shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])}",
        "# Run it again: framework run recipe.yaml [key=value ...]   (a fresh run: new name, no resume)",
    ]
    return "\n".join(lines) + "\n"


def hydra_settings() -> dict:
    """The shipped `hydra:` block (run and sweep directories, callbacks), kept unresolved."""
    return OmegaConf.to_container(OmegaConf.load(conf_dir() / "train.yaml").hydra, resolve=False)


def standalone_recipe(config: dict) -> dict:
    """The resolved config as a recipe that composes on its own (only the schema as a default)."""
    body = {key: value for key, value in config.items() if key != "hydra"}
    body.update(FRESH_RUN)
    return {"defaults": ["train_schema", "_self_"], **body, "hydra": hydra_settings()}


def write_recipe(config: dict, path: Path) -> None:
    text = OmegaConf.to_yaml(OmegaConf.create(standalone_recipe(config)))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(header(str(config.get("name"))) + text)
    tmp.replace(path)
