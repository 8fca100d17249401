"""Sharded from birth: build a model on the meta device, shard it, then give each rank only its
shards of the weights an ordinary build would have made with the same seed.

Building on the meta device records every initialiser the model's own constructor calls
(`nn.init.*`, `tensor.normal_()`, ..., in order; framework/construction/meta_build.py). Replaying that
log one parameter at a time on real tensors, with the global RNG, draws exactly the random numbers
an ordinary build draws, in the same order, so the values are bit-identical and the RNG ends in
the same state. A parameter is materialised in full only from the last initialiser that
overwrites all of it to its last initialiser; earlier calls (e.g. nn.Linear's kaiming init that
GPT's `_init_weights` replaces) run on a scratch tensor only to draw their random numbers. After
each parameter's last call, `write(name, full)` keeps this rank's part (a DTensor's shard) and the
full tensor is dropped: a rank holds its shards plus one parameter at a time, never the model.

A buffer computed in a constructor (a rotary embedding's inverse frequencies: Llama, Qwen2, ...)
cannot be recorded, but where it belongs to a small module without parameters that is made from
the model's config (`Module(config)`, as Hugging Face builds them), that module is built again on
the CPU after the shards are made and its buffers are copied over.

What cannot be replayed (values made by a random factory such as `torch.randn` in `__init__`,
another computed buffer, an initialiser reading another meta tensor) is reported in the log's
`problem`, and the strategy then builds the model whole, saying why.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from framework.construction.meta_build import RANDOM_FACTORIES, meta_device

# Initialisers that set every element without reading the old values: what came before them on
# the same tensor only matters for the random numbers it drew.
OVERWRITING = {"normal_", "uniform_", "zero_", "zeros_", "ones_", "fill_", "constant_", "kaiming_uniform_",
               "kaiming_normal_", "xavier_uniform_", "xavier_normal_", "trunc_normal_", "orthogonal_", "eye_",
               "dirac_", "sparse_", "random_", "exponential_", "geometric_", "log_normal_", "cauchy_", "bernoulli_"}


def _storage(t: torch.Tensor) -> int:
    """Meta tensors that alias (a parameter, its `.data`, a view of it) share a storage object."""
    return t.untyped_storage()._cdata


def _target(args, kwargs):
    return args[0] if args else kwargs.get("tensor")


@dataclass
class _Op:
    func: Callable
    args: tuple
    kwargs: dict
    name: str | None  # the parameter or buffer it initialises (None: a tensor the model no longer holds)
    geometry: tuple  # (size, stride, storage offset) of the tensor it was called on
    whole: bool  # it overwrites every element of the parameter
    storage: tuple  # (elements, dtype) of the storage it was called on, for a scratch copy


@dataclass
class InitLog:
    """A meta-device build's initialisers, resolved to parameter and buffer names."""

    ops: list[_Op] = field(default_factory=list)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> the meta tensor (shape, dtype)
    rebuilt: dict[str, nn.Module] = field(default_factory=dict)  # owner name -> a module whose buffers are rebuilt
    problem: str | None = None  # why it cannot be replayed; None when it can


def build_on_meta(factory: Callable[[], nn.Module]) -> tuple[nn.Module, InitLog]:
    """`factory()` on the meta device (no memory, no initialisation), and its initialisers."""
    record: list = []
    with meta_device(record):
        model = factory()
    return model, resolve(model, record)


def resolve(model: nn.Module, record: list) -> InitLog:
    log = InitLog()
    by_storage: dict[int, str] = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_meta:
            log.tensors[name] = tensor
            by_storage.setdefault(_storage(tensor), name)
    initialised = set()
    buffer_names = {name for name, _ in model.named_buffers()}
    for func, args, kwargs in record:
        label = getattr(func, "__name__", str(func))
        if func in RANDOM_FACTORIES:
            log.problem = f"its constructor makes values with torch.{label}, which the meta device cannot record"
            return log
        target = _target(args, kwargs)
        # None: a tensor the model dropped after initialising it (nn.Linear's weight that GPT
        # replaces by the tied embedding): replayed on scratch, for the random numbers it drew
        name = by_storage.get(_storage(target))
        owner = name.rpartition(".")[0] if name in buffer_names else None
        if owner is not None and _rebuildable(model.get_submodule(owner)):  # made again for real after
            log.rebuilt[owner] = model.get_submodule(owner)
            initialised.add(name)
            continue
        others = [a for a in [*args[1:], *kwargs.values()] if isinstance(a, torch.Tensor) and a is not target]
        if any(o.is_meta for o in others):
            log.problem = f"its constructor calls {label} with another tensor's values, which the meta device lacks"
            return log
        whole = name is not None and label in OVERWRITING and _covers(target, log.tensors[name])
        elements = target.untyped_storage().nbytes() // target.element_size()
        log.ops.append(_Op(func, args, kwargs, name, (tuple(target.shape), tuple(target.stride()),
                                                      target.storage_offset()), whole, (elements, target.dtype)))
        initialised.add(name)
    buffers = [n for n, _ in model.named_buffers() if n in log.tensors and n not in initialised]
    for name in buffers:
        owner = name.rpartition(".")[0]
        if _rebuildable(model.get_submodule(owner)):
            log.rebuilt[owner] = model.get_submodule(owner)
        else:
            log.problem = (f"its buffer {name} is computed in its constructor, which the meta device cannot "
                           "record")
            break
    return log


def _rebuildable(module: nn.Module) -> bool:
    """A module without parameters made from a config alone (Hugging Face's rotary embeddings)."""
    return next(module.parameters(), None) is None and getattr(module, "config", None) is not None


def _covers(view: torch.Tensor, tensor: torch.Tensor) -> bool:
    return (view.storage_offset() == 0 and tuple(view.shape) == tuple(tensor.shape)
            and tuple(view.stride()) == tuple(tensor.stride()))


def _call(op: _Op, base: torch.Tensor) -> None:
    size, stride, offset = op.geometry
    view = base.as_strided(size, stride, offset)
    if op.args:
        op.func(view, *op.args[1:], **op.kwargs)
    else:
        op.func(**{**op.kwargs, "tensor": view})


@torch.no_grad()
def replay(log: InitLog, write: Callable[[str, torch.Tensor], None]) -> None:
    """Run the recorded initialisers in order on CPU tensors and hand each finished full tensor
    to `write(name, tensor)` (float32 or the meta tensor's dtype, as the model made it). Tensors
    no initialiser touched are written as zeros (an ordinary build leaves them uninitialised)."""
    if log.problem:
        raise ValueError(log.problem)
    last = {op.name: i for i, op in enumerate(log.ops)}
    kill = {op.name: i for i, op in enumerate(log.ops) if op.whole}  # the last whole overwrite wins
    live: dict[str, torch.Tensor] = {}
    for name, meta in log.tensors.items():
        if name not in last:
            write(name, torch.zeros(meta.shape, dtype=meta.dtype))
    for i, op in enumerate(log.ops):
        if op.name is None or i < kill.get(op.name, -1):  # overwritten later: draw the random numbers only
            elements, dtype = op.storage
            _call(op, torch.empty(elements, dtype=dtype))
            continue
        meta = log.tensors[op.name]
        if op.name not in live:
            live[op.name] = torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype).zero_()
        _call(op, live[op.name])
        if i == last[op.name]:
            write(op.name, live.pop(op.name))
    for owner, module in log.rebuilt.items():  # computed buffers: the module made again, for real
        with torch.device("cpu"):
            fresh = type(module)(module.config)
        for name, buffer in fresh.named_buffers(recurse=False):
            write(f"{owner}.{name}" if owner else name, buffer)
