"""A declarative, config-driven PyTorch training framework.

`framework.run(cfg)` is the whole runner; `train.py` only wraps it in `@hydra.main`.
Importing this package is cheap: torch and every plugin are imported when used.
"""
from framework.config import resolvers as _resolvers
from framework.config import schema as _schema  # noqa: F401  (registers the structured configs with Hydra)

_resolvers.register()

__version__ = "0.1.0"


def run(cfg, output_dir=None):
    """Validate `cfg`, build the plugins, launch the processes and train; returns the objective."""
    from framework.runner import run as _run

    return _run(cfg, output_dir)


def guard(main, config_dir=None, config_name: str = "train"):
    """Call a `@hydra.main` function, turning Hydra's configuration errors into exit code 2.
    `config_dir`/`config_name`: the function's primary config (default: the shipped conf/train)."""
    from framework.errors import guard_hydra_main

    return guard_hydra_main(main, config_dir, config_name)


__all__ = ["run", "guard", "__version__"]
