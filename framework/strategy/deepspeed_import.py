"""`import deepspeed` without what its import pulls in for features the framework never uses.

DeepSpeed's package import reaches its autotuner, which imports mlflow when it is installed (and
mlflow pandas, scipy and its tracking stack): measured here, 1.3 s and 135 MiB resident in every
process of a DeepSpeed run, against 0.15 s and 22 MiB without it. The autotuner is not used
(the framework drives DeepSpeed through deepspeed.initialize), so mlflow is kept out of that one
import; `logger=mlflow` still imports it when chosen, before or after.
"""
from __future__ import annotations

import importlib
import sys
from types import ModuleType

#: packages DeepSpeed's import would load only for features the framework does not use
KEPT_OUT = ("mlflow",)


def deepspeed_package() -> ModuleType:
    """The deepspeed package, imported once without the packages in KEPT_OUT (unless something
    has imported them already)."""
    if "deepspeed" in sys.modules:
        return sys.modules["deepspeed"]
    hidden = [name for name in KEPT_OUT if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # `import name` raises ImportError
    try:
        return importlib.import_module("deepspeed")
    finally:
        for name in hidden:
            if sys.modules.get(name) is None:
                del sys.modules[name]
