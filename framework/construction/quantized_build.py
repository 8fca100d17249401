"""Quantized from birth: under a quantized precision (precision=bnb_*), the model is built on the
meta device and its recorded initialisers are replayed one tensor at a time
(framework/construction/meta_init.py); each linear layer chosen for quantization becomes its quantized
layer as soon as its weight (and bias) are complete. The float32 model never exists whole: the
set-up peak is the quantized model, the layers kept in float, and one float layer. The weights
are bit-identical to quantizing an ordinary build with the same seed (tested), and the RNG ends in
the same state.

A model whose constructor cannot be replayed (values from torch.randn, a buffer computed from
other tensors) is built whole and quantized afterwards, as before.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from framework.construction.meta_init import build_on_meta, replay
from framework.construction.tied import retie, tied_parameters


def _place(module: nn.Module, leaf: str, tensor: torch.Tensor) -> None:
    if leaf in module._parameters:
        module._parameters[leaf] = nn.Parameter(tensor, requires_grad=module._parameters[leaf].requires_grad)
    else:
        module._buffers[leaf] = tensor


def build_quantized(factory: Callable[[], nn.Module], precision) -> nn.Module:
    """`factory()`'s model with `precision`'s chosen linear layers quantized as they are made."""
    model, log = build_on_meta(factory)
    if log.problem:
        return factory()  # a meta build draws no random numbers: this is the ordinary build
    tied = tied_parameters(model)
    chosen = set(precision.plan_layers(model)[0])
    modules = dict(model.named_modules())
    waiting: dict[str, set[str]] = {name: {"weight", "bias"} if modules[name].bias is not None else {"weight"}
                                    for name in chosen}

    def write(name: str, tensor: torch.Tensor) -> None:
        owner, _, leaf = name.rpartition(".")
        module = modules[owner]
        _place(module, leaf, tensor)
        if owner in waiting:
            waiting[owner].discard(leaf)
            if not waiting[owner]:  # complete: quantize it and let the float layer go
                parent, _, child = owner.rpartition(".")
                setattr(modules[parent], child, precision.quantized_layer(module))
                del waiting[owner]
                modules[owner] = None

    replay(log, write)
    retie(model, tied)
    return model
