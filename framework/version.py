"""The framework's version and the versions a run records (checkpoints, recipe.yaml, `framework version`)."""
from __future__ import annotations

import platform
import sys
from importlib import metadata

__version__ = "0.1.0"

OPTIONAL_PACKAGES = ("deepspeed", "fairscale")


def package_version(name: str) -> str | None:
    """An installed distribution's version, without importing it (None when not installed)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def versions(optional: bool = False) -> dict[str, str]:
    """framework, torch and Python versions; with `optional`, the installed optional engines too."""
    torch = sys.modules.get("torch")  # imported: its own string (a local build's label included)
    torch_version = torch.__version__ if torch is not None else package_version("torch")
    found = {"framework": __version__, "torch": str(torch_version or "not installed"),
             "python": platform.python_version()}
    if optional:
        found.update({name: v for name in OPTIONAL_PACKAGES if (v := package_version(name))})
    return found
