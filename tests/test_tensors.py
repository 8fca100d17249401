"""framework/tensors.py: the one walker that moves, casts and copies nested batches and states."""
from __future__ import annotations

import importlib
from collections import namedtuple

import torch

from framework.precision.base import cast_floating
from framework.tensors import map_tensors

Pair = namedtuple("Pair", "x y")


def test_every_tensor_is_mapped_and_containers_keep_their_types():
    data = {"a": torch.ones(2), "b": [torch.zeros(1), (torch.full((1,), 3.0), "label")], "c": Pair(torch.ones(1), 7)}
    out = map_tensors(data, lambda t: t * 2)
    assert out["a"].tolist() == [2.0, 2.0] and isinstance(out["b"], list) and isinstance(out["b"][1], tuple)
    assert out["b"][1][0].item() == 6.0 and out["b"][1][1] == "label"
    assert isinstance(out["c"], Pair) and out["c"].x.item() == 2.0 and out["c"].y == 7


def test_the_walkers_built_on_it():
    batch = Pair(torch.ones(2), torch.tensor([1, 2]))
    cast = cast_floating(batch, torch.bfloat16)
    assert cast.x.dtype == torch.bfloat16 and cast.y.dtype == torch.int64  # integers are left alone
    live = {"w": torch.ones(2)}
    copy = importlib.import_module("framework.checkpoint_io.async").snapshot(live)  # `async`: a keyword
    live["w"].add_(1)
    assert copy["w"].tolist() == [1.0, 1.0]
