"""One walker over nested containers of tensors, for every place that moves, casts or copies a
batch or a state, and a rank's part of a whole tensor laid out as a DTensor is (ground floor:
imports nothing of the framework)."""
from __future__ import annotations

import hashlib
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


def strided_part(full: torch.Tensor, dim: int, split_factor: int, ranks: int, rank: int) -> torch.Tensor:
    """Rank `rank` of `ranks`' part of `full` under a strided shard (torch's _StridedShard): `full`
    cut into `split_factor` pieces along `dim` (a fused layer's q, k and v), each piece split over
    the ranks, this rank's parts of the pieces side by side."""
    return torch.cat([piece.chunk(ranks, dim)[rank] for piece in full.chunk(split_factor, dim)], dim)


def strided_whole(parts: list[torch.Tensor], dim: int, split_factor: int) -> torch.Tensor:
    """The inverse of strided_part: every rank's part (in rank order) put back together."""
    pieces = [part.chunk(split_factor, dim) for part in parts]
    return torch.cat([p[piece] for piece in range(split_factor) for p in pieces], dim)


def local_part(full: torch.Tensor, like) -> torch.Tensor:
    """This rank's part of `full` laid out as the DTensor `like` (`full` itself for a plain tensor).
    On a 2-D mesh (model_parallel, hsdp) the last dimension's placement is applied first and
    FSDP's then splits that rank's part along its dimension, as fully_shard lays out a parameter
    it shards on top of another split (its strided shard on the first dimension means exactly
    that). A strided shard on the last dimension (a fused layer's thirds) is cut here, not by
    DTensor: from torch 2.11 on DTensor reads a lone strided shard as a shard order."""
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    if not isinstance(like, DTensor):
        return full
    mesh, part = like.device_mesh, full.detach()
    with torch.no_grad():
        for dim in reversed(range(mesh.ndim)):
            placement = like.placements[dim]
            sub = mesh[mesh.mesh_dim_names[dim]] if mesh.ndim > 1 else mesh
            if isinstance(placement, _StridedShard) and dim == mesh.ndim - 1:
                part = strided_part(part, placement.dim, placement.split_factor, sub.size(), sub.get_local_rank())
                continue
            if isinstance(placement, _StridedShard):
                placement = Shard(placement.dim)
            part = distribute_tensor(part, sub, [placement], src_data_rank=None).to_local()
    return part


def write_part(whole: torch.Tensor, target: torch.Tensor) -> None:
    """Copy this rank's part of `whole` into `target` (a DTensor's local part, or a plain tensor)."""
    with torch.no_grad():
        (target.to_local() if hasattr(target, "to_local") else target).copy_(local_part(whole, target))


def weights_digest(state: dict) -> str:
    """sha256 over a state dict's names and tensor bytes, in name order: equal exactly when every
    tensor is bit-equal (replica groups' final weights, compared in their summary.json)."""
    digest = hashlib.sha256()
    for name in sorted(state):
        value = state[name]
        digest.update(name.encode())
        if isinstance(value, torch.Tensor):
            flat = value.detach().cpu().contiguous().reshape(-1)
            digest.update(str(value.dtype).encode())
            digest.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return digest.hexdigest()
