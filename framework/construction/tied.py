"""Tied parameters (one Parameter registered under several names, like a language model's head
tied to its embedding): found before a model's tensors are replaced, tied again after."""
from __future__ import annotations

from torch import nn


def tied_parameters(model: nn.Module) -> list[list[str]]:
    """Names of each parameter registered under several names (a head tied to its embedding)."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def retie(model: nn.Module, groups: list[list[str]]) -> None:
    """Register the first parameter of each group under its other names again (after the first
    name got a new tensor: materialised, or moved to a device that copies per name)."""
    for first, *others in groups:
        param = model.get_parameter(first)
        for name in others:
            owner, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(owner), leaf, param)
