"""DeepSpeed without what it imports for features the framework does not use.

- `deepspeed_package()`: DeepSpeed's package import reaches its autotuner, which imports mlflow
  when it is installed (and mlflow pandas, scipy and its tracking stack): measured here, 1.3 s and
  135 MiB resident in every process of a DeepSpeed run, against 0.15 s and 22 MiB without it. The
  autotuner is not used (the framework drives DeepSpeed through deepspeed.initialize), so mlflow is
  kept out of that one import; `logger=mlflow` still imports it when chosen, before or after.
- `muon_left_uncompiled()`: DeepSpeed's ZeRO optimizers import its Muon optimizer's module when
  they are made, only to check whether the optimizer they wrap is Muon; that module wraps three
  functions in torch.compile as it is imported, which loads torch's compiler (1 s and 44 MiB in
  every process). When the optimizer is a torch one, Muon cannot run in the run, and the module is
  imported with those functions left as plain Python (still correct if a later run in the same
  process chose DeepSpeed's Muon: only slower).
"""
from __future__ import annotations

import importlib
import sys
from types import ModuleType

from framework.strategy.deepspeed.op_locks import watch_op_builds

#: packages DeepSpeed's import would load only for features the framework does not use
KEPT_OUT = ("mlflow",)
#: the module DeepSpeed's ZeRO optimizers import to recognise Muon
MUON_MODULE = "deepspeed.runtime.zero.muon.muon_optimizer"


def deepspeed_package() -> ModuleType:
    """The deepspeed package, imported once without the packages in KEPT_OUT (unless something
    has imported them already), with its op builds watched (framework/strategy/deepspeed/op_locks.py:
    a lock left by a build that stopped is taken over, a wait says what it waits for)."""
    watch_op_builds()
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


def muon_left_uncompiled() -> None:
    """Import DeepSpeed's Muon module (once) with torch.compile's decorator replaced by nothing.
    Call only when the run's optimizer is not DeepSpeed's Muon."""
    if MUON_MODULE in sys.modules:
        return
    compiler = importlib.import_module("deepspeed.runtime.compiler")
    original = compiler.compile
    compiler.compile = lambda: (lambda function: function)
    try:
        importlib.import_module(MUON_MODULE)
    finally:
        compiler.compile = original
