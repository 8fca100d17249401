"""A declarative, config-driven PyTorch training framework.

`framework.run(cfg)` is the whole runner; `train.py` only wraps it in `@hydra.main` and
`framework.guard`. The package root stands above every floor of the layering
(docs/architecture.md): nothing inside the framework imports it, and it loads `run` and `guard`
on first use (PEP 562), because every `import framework.x` runs this file first and must stay
cheap (the runner imports torch).
"""
import importlib
import os

# torch's float32 matmuls on an x86 CPU are MKL's. Without its conditional numerical
# reproducibility mode MKL may pick kernels by the operands' memory alignment, so one job can end
# with other bits from one run to the next; strict mode gives the same bits at the same thread count
# whatever the alignment (docs/checkpoints.md, "Reproducibility"). MKL reads it at its first call: set before any.
# A value the user set wins (e.g. MKL_CBWR=AUTO: reproducible for aligned operands only).
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

from framework.config import resolvers as _resolvers  # noqa: E402  (after MKL_CBWR: nothing below may call MKL first)
from framework.config import schema as _schema  # noqa: F401  (registers the structured configs with Hydra)
from framework.version import __version__

_resolvers.register()

_PUBLIC = {"run": "framework.runner", "guard": "framework.entry_guard"}


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'framework' has no attribute {name!r}")


__all__ = ["run", "guard", "__version__"]
