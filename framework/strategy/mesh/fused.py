"""Whole tensors from a mesh's DTensors, a fused layer's by hand.

A fused layer (colwise_fused3) is split into thirds by tensor parallelism (a strided shard) and its
rank's part split again by FSDP2. DTensor's own gathers and redistributions get that nested layout
wrong (measured: the gathered q/k/v rows out of order at 2x2), so checkpoints gather and place those
tensors here, one dimension of the mesh at a time, as the layout was made (framework/tensors.py's
local_part/write_part are the inverse)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from framework.tensors import strided_whole


def is_fused(tensor) -> bool:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import _StridedShard

    return isinstance(tensor, DTensor) and isinstance(tensor.placements[-1], _StridedShard)


def gather_fused(tensor) -> torch.Tensor:
    """Collective over the mesh: the whole of a fused layer's DTensor, on every rank. The
    tensor-parallel thirds are gathered by hand (framework/tensors.py strided_whole): DTensor's
    own gather of a lone strided shard fails from torch 2.11 on."""
    from torch.distributed.tensor import DTensor, Shard

    mesh, part = tensor.device_mesh, tensor.to_local()
    rows = tensor.shape[0] // mesh.size(mesh.ndim - 1)  # this tensor-parallel rank's rows, before FSDP split them
    for dim in range(mesh.ndim - 1):  # the data-parallel split of this rank's rows (replicas hold them whole)
        if tensor.placements[dim].is_replicate():
            continue
        shape = (rows, *tensor.shape[1:])
        part = DTensor.from_local(part, mesh[mesh.mesh_dim_names[dim]], [Shard(0)], shape=shape,
                                  stride=torch.empty(shape, device="meta").stride()).full_tensor()
    tp = mesh[mesh.mesh_dim_names[-1]] if mesh.ndim > 1 else mesh
    parts = [torch.empty_like(part) for _ in range(tp.size())]
    dist.all_gather(parts, part.contiguous(), group=tp.get_group())
    strided = tensor.placements[-1]
    return strided_whole(parts, strided.dim, strided.split_factor)


def whole_tensor(value):
    """Collective for a DTensor: the whole tensor on the CPU (a fused layer's gathered by hand);
    anything else as it is."""
    from torch.distributed.tensor import DTensor

    if is_fused(value):
        return gather_fused(value).cpu()
    if isinstance(value, DTensor):
        return value.full_tensor().cpu()
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def contiguous_layout(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` unchanged, unless it is a fused layer's: then a copy whose rows are split over the
    data-parallel ranks (replicated over the replicas of hybrid sharding) and whole on each
    tensor-parallel rank, a layout DCP describes."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    if not is_fused(tensor):
        return tensor
    layout = [p if p.is_replicate() else Shard(0) for p in tensor.placements[:-1]] + [Replicate()]
    return distribute_tensor(gather_fused(tensor), tensor.device_mesh, layout, src_data_rank=None)


def fused_entries(model: torch.nn.Module, optimizer=None) -> dict[str, dict]:
    """{parameter name: {"param": its DTensor, state name: optimizer state DTensor}} of the fused
    layers of `model` (unwrapped)."""
    found = {name: {"param": p} for name, p in model.named_parameters() if is_fused(p)}
    if optimizer is not None:
        by_param = {id(entry["param"]): entry for entry in found.values()}
        for param, state in optimizer.state.items():
            entry = by_param.get(id(param))
            if entry is not None:
                entry.update({k: v for k, v in state.items() if is_fused(v)})
    return found
