"""One walker over nested containers of tensors, for every place that moves, casts or copies a
batch or a state (ground floor: imports nothing of the framework)."""
from __future__ import annotations

from typing import Any, Callable

import torch


def map_tensors(data: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """`data` with `fn` applied to every tensor inside it (dicts, lists, tuples and named tuples,
    nested); anything else is returned as it is."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, dict):
        return {k: map_tensors(v, fn) for k, v in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # a named tuple takes its fields as arguments
        return type(data)(*(map_tensors(v, fn) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(map_tensors(v, fn) for v in data)
    return data
