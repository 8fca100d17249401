"""The collectives every strategy offers the loop, over the default process group; with none (a
lone process) they are identities."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

_REDUCE_OPS = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN"}


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def barrier() -> None:
    if distributed():
        dist.barrier()


def broadcast(obj: Any, src: int = 0) -> Any:
    if not distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's `tensor` (same shape on each) stacked into shape (world_size, *shape)."""
    if not distributed():
        return tensor.unsqueeze(0)
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(out, tensor.contiguous())
    return torch.stack(out)


def reduce(tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
    """`tensor` reduced over all ranks with op in {sum, mean, max, min}; every rank gets it."""
    if op not in _REDUCE_OPS:
        raise ValueError(f"reduce op must be one of {sorted(_REDUCE_OPS)}, not {op!r}")
    if not distributed():
        return tensor
    out = tensor.clone()
    dist.all_reduce(out, op=getattr(dist.ReduceOp, _REDUCE_OPS[op]))
    return out / dist.get_world_size() if op == "mean" else out
