"""Where the framework's own config tree lives."""
from __future__ import annotations

from pathlib import Path

from framework.errors import ConfigError


def conf_dir() -> Path:
    """The shipped `conf/` (next to the package in a source checkout or editable install)."""
    candidate = Path(__file__).resolve().parents[1] / "conf"
    if (candidate / "train.yaml").is_file():
        return candidate
    raise ConfigError(f"cannot find the framework's conf/ directory (looked in {candidate}); "
                      "install the framework from its source tree with `pip install -e .`.")
