"""The whole model's forward across a pipeline's ranks, without gradients (validation, test,
predict): each stage runs in order on the rank that holds it, its output sent to the next stage's
rank, and the last stage's output handed to every rank of the pipeline, so a task's scoring code
runs unchanged on each of them (one rank of each pipeline reports: framework/loop/evaluation.py).

Training goes through torch's schedules instead (framework/strategy/mesh/pipeline/run.py); a forward-only
pass has no backward to overlap, so stage after stage is all a schedule would do, and this pass
also takes batches of any shape (a short last batch, another sequence length) where a schedule is
built for one.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32]
_HEADER = 8  # dtype, rank of the tensor, up to 6 dimensions


def _header(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    if tensor.dim() > _HEADER - 2 or tensor.dtype not in _DTYPES:
        raise ValueError(f"a pipeline stage passed on a {tensor.dtype} tensor of {tensor.dim()} dimensions; "
                         f"stages pass tensors of at most {_HEADER - 2} dimensions in {_DTYPES}")
    values = [_DTYPES.index(tensor.dtype), tensor.dim(), *tensor.shape]
    return torch.tensor(values + [0] * (_HEADER - len(values)), dtype=torch.int64, device=device)


def _empty_from(header: torch.Tensor, device: torch.device) -> torch.Tensor:
    values = header.tolist()
    return torch.empty(values[2:2 + values[1]], dtype=_DTYPES[values[0]], device=device)


def send(tensor: torch.Tensor, to: int, device: torch.device) -> None:
    dist.send(_header(tensor, device), dst=to)
    dist.send(tensor.contiguous(), dst=to)


def receive(source: int, device: torch.device) -> torch.Tensor:
    header = torch.empty(_HEADER, dtype=torch.int64, device=device)
    dist.recv(header, src=source)
    tensor = _empty_from(header, device)
    dist.recv(tensor, src=source)
    return tensor


def share(tensor: torch.Tensor | None, source: int, group, device: torch.device) -> torch.Tensor:
    """`tensor` of global rank `source` on every rank of `group` (shape and dtype sent first)."""
    header = _header(tensor, device) if tensor is not None else torch.empty(_HEADER, dtype=torch.int64, device=device)
    dist.broadcast(header, src=source, group=group)
    out = tensor.contiguous() if tensor is not None else _empty_from(header, device)
    dist.broadcast(out, src=source, group=group)
    return out


def forward_across(stages: dict, owners: list[int], me: int, x: torch.Tensor, group,
                   device: torch.device) -> torch.Tensor:
    """Collective over the pipeline `group`: the last stage's output for input `x` (read by the
    first stage's rank), on every rank. `stages`: {stage index: module} this rank holds;
    `owners[s]`: the global rank holding stage s."""
    h = x
    for index, owner in enumerate(owners):
        if owner != me:
            continue
        if index > 0 and owners[index - 1] != me:
            h = receive(owners[index - 1], device)
        h = stages[index](h)
        if index + 1 < len(owners) and owners[index + 1] != me:
            send(h, owners[index + 1], device)
    last = owners[-1]
    return share(h if last == me else None, last, group, device)
