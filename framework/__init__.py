"""A declarative, config-driven PyTorch training framework.

`framework.run(cfg)` is the whole runner; `train.py` only wraps it in `@hydra.main` and
`framework.guard`. The package root stands above every floor of the layering
(docs/architecture.md): nothing inside the framework imports it, and it loads `run` and `guard`
on first use (PEP 562), because every `import framework.x` runs this file first and must stay
cheap (the runner imports torch).
"""
import importlib

from framework.config import resolvers as _resolvers
from framework.config import schema as _schema  # noqa: F401  (registers the structured configs with Hydra)
from framework.version import __version__

_resolvers.register()

_PUBLIC = {"run": "framework.runner", "guard": "framework.entry_guard"}


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'framework' has no attribute {name!r}")


__all__ = ["run", "guard", "__version__"]
