"""Building a model on the meta device to check its constructor, without paying for its
initialisation: on meta tensors, torch runs init functions (normal_, uniform_, ...) through its
reference decompositions, whose first use imports torch._dynamo and sympy (~1.5 s of start-up).
On the meta device those calls change nothing (there is no data), so they are skipped."""
from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

# In-place initialisers a module's __init__ calls on its parameters and buffers.
_INIT_METHODS = {"normal_", "uniform_", "zero_", "fill_", "copy_", "exponential_", "random_", "bernoulli_",
                 "geometric_", "log_normal_", "cauchy_", "erfinv_", "clamp_", "mul_", "add_", "sub_", "div_"}


# Factories whose meta version goes through torch's reference decompositions (the sympy import
# above): made on the CPU (they are small: positions, masks) and moved to the meta device.
_CPU_FACTORIES = {torch.arange}


# Factories that draw random numbers: on the meta device they draw none, so a model that makes
# its initial values with them cannot have its initialisation recorded (framework/construction/meta_init.py).
RANDOM_FACTORIES = {torch.rand, torch.randn, torch.randint, torch.randperm, torch.normal, torch.rand_like,
                    torch.randn_like, torch.randint_like, torch.bernoulli, torch.multinomial, torch.poisson}


class _SkipMetaInit(TorchFunctionMode):
    def __init__(self, record: list | None = None):
        super().__init__()
        self.record = record

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        on_meta = torch.device(kwargs.get("device") or "meta").type == "meta"
        if func in _CPU_FACTORIES and on_meta:
            return func(*args, **{**kwargs, "device": "cpu"}).to("meta")
        if self.record is not None and func in RANDOM_FACTORIES and on_meta:
            self.record.append((func, args, kwargs))
        target = args[0] if args else kwargs.get("tensor")  # torch.nn.init passes it by keyword
        name = getattr(func, "__name__", "")
        is_init = getattr(func, "__module__", "") == "torch.nn.init" or name in _INIT_METHODS
        if is_init and isinstance(target, torch.Tensor) and target.is_meta:
            if self.record is not None:
                self.record.append((func, args, kwargs))
            return target
        return func(*args, **kwargs)


_building_without_weights = 0


@contextlib.contextmanager
def sharded_build():
    """Marks a model build whose weights come later (the meta device, DeepSpeed's partitioned
    init): a model that would read pretrained weights in its constructor reads only their shapes,
    and names its weight files instead (framework/models/hf_causal_lm.py)."""
    global _building_without_weights
    _building_without_weights += 1
    try:
        yield
    finally:
        _building_without_weights -= 1


def in_sharded_build() -> bool:
    return _building_without_weights > 0


@contextlib.contextmanager
def meta_device(record: list | None = None):
    """`with torch.device("meta")`, with initialisers skipped; with `record`, every skipped
    initialiser call (and every random factory) is appended to it as (func, args, kwargs), in
    order, for framework/construction/meta_init.py to replay on real tensors."""
    with torch.device("meta"), _SkipMetaInit(record), sharded_build():
        yield
