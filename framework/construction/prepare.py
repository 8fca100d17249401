"""The steps a strategy's `setup` takes on a built model before wrapping it: the precision's module
conversion, activation checkpointing of its units, and placement on the rank's device."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from framework.construction.activation_checkpointing import checkpoint_units
from framework.construction.tied import retie, tied_parameters
from framework.construction.units import Units


def with_adapter(model: nn.Module, adapter) -> nn.Module:
    """The model with the adapter's layers injected (everything else frozen), or unchanged."""
    return model if adapter is None else adapter.apply(model)


def is_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def convert_precision(model: nn.Module, precision, talk: bool) -> nn.Module:
    """The precision's module conversion (casts, quantized layers), said once when it did more
    than cast."""
    model = precision.convert_module(model)
    if precision.conversion_note and talk:
        print(precision.conversion_note, flush=True)
    return model


def checkpoint_activations(model: nn.Module, units: Callable[[nn.Module], Units], enabled: bool, talk: bool) -> None:
    """With `trainer.activation_checkpointing` (`enabled`), checkpoint every unit, before wrapping."""
    if not enabled:
        return
    chosen = units(model)
    checkpoint_units(chosen)
    if talk:
        print(f"activation checkpointing: {chosen.describe()}", flush=True)


def place_model(model: nn.Module, device: torch.device) -> nn.Module:
    """The model on this rank's device, tied parameters still tied (a move that copies per name, as
    XLA's does, would give a head tied to its embedding a tensor of its own; where `.to` keeps them
    tied this re-registers the same parameter). A model still on the meta device is placed when
    materialised."""
    if is_meta(model):
        return model
    tied = tied_parameters(model)
    model = model.to(device)
    retie(model, tied)
    return model
