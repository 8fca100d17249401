"""ZeRO-3's partitioned build with the weights every other strategy starts from.

`deepspeed.zero.Init` builds each module's parameters on the accelerator and partitions them at
once. On a GPU, the model's initialisers (nn.init.normal_, ...) then draw from the GPU's random
number generator, not the CPU's that every other strategy's build uses (measured on an H100: the
loss before any update 5.4791 under ZeRO-3 against 5.4801 under all the others and under ZeRO-3 on
the CPU, for the same seed). Here the build is recorded once more on the meta device and its
initialisers replayed on the CPU with the CPU's generator from the same state
(framework/construction/meta_init.py), one parameter at a time, each rank copying its partition:
the weights, and the CPU generator's state afterwards, are an ordinary build's."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from framework.construction.meta_init import build_on_meta, replay


def partition_of(param: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """This rank's piece of `full` as ZeRO-3 partitions the parameter: the flattened tensor cut into
    equal partitions (the last padded), the rank's partition by its rank in the partition group."""
    size = param.ds_tensor.ds_numel
    start = size * int(getattr(param, "ds_zero_partition_rank", 0))
    return full.reshape(-1)[start:start + size]


def initialise_from_cpu(model: nn.Module, factory: Callable[[], nn.Module], rng_state: torch.Tensor) -> str:
    """Write into `model` (built inside zero.Init) the weights an ordinary build makes from the CPU
    generator in `rng_state`; returns why it could not ('' when it did)."""
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    current = torch.get_rng_state()
    torch.set_rng_state(rng_state)
    _, log = build_on_meta(factory)
    if log.problem:
        torch.set_rng_state(current)
        return log.problem

    def write(name: str, full: torch.Tensor) -> None:
        target = params.get(name, buffers.get(name))
        if target is None:
            return
        with torch.no_grad():
            if getattr(target, "ds_tensor", None) is not None:
                piece = partition_of(target, full)
                target.ds_tensor.narrow(0, 0, piece.numel()).copy_(piece)
                if target.data.numel() == full.numel():  # a parameter ZeRO-3 keeps whole (persistent)
                    target.data.copy_(full.view_as(target.data))
            else:
                target.data.copy_(full)

    replay(log, write)
    return ""
