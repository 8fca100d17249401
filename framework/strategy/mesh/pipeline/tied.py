"""A head tied to its embedding, on another pipeline stage: the last stage's copy and the first
stage's embedding each get the sum of both gradients before clipping (Megatron's way), so the two
stay equal step after step."""
from __future__ import annotations

import torch
import torch.distributed as dist


def tied_group(owners: list[int], pipeline_size: int, block: int, rank: int):
    """The process groups of the first and last stages' ranks at each of the `block` places of a
    pipeline rank (data x tensor parallel; every rank creates all of them, as new_group requires);
    this rank's, or None where one rank holds both stages (a V schedule's)."""
    if owners[0] == owners[-1]:
        return None
    mine = None
    for inner in range(block):
        ranks = [inner, (pipeline_size - 1) * block + inner]  # stage 0 on pipeline rank 0; the last on the last
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = group
    return mine


def sum_tied_gradients(part, tied_names: tuple[str, str], group) -> None:
    """`part`'s embedding or head copy (or both, on one rank) given the sum of both gradients; a
    rank holding neither does nothing. `group`: tied_group's, or None for both on this rank."""
    params = dict(part.named_parameters(remove_duplicate=False))
    if group is None:
        if not (part.holds_first and part.holds_last):
            return
        embedding, head = params[tied_names[0]], params[tied_names[1]]
        if embedding.grad is not None and head.grad is not None:
            total = embedding.grad + head.grad
            embedding.grad.copy_(total)
            head.grad.copy_(total)
        return
    name = tied_names[0] if part.holds_first else tied_names[1] if part.holds_last else None
    if name is None:
        return
    param = params[name]
    if param.grad is None:  # no gradient reached it this step: the other side's alone
        param.grad = torch.zeros_like(param)
    grad = param.grad
    dist.all_reduce(grad.to_local() if hasattr(grad, "to_local") else grad, group=group)
