"""A callback for benchmarks/memory_per_rank.py's `mesh` part: on each rank, (1) the largest unit
that FSDP gathers at once, read from the live sharded model (each unit's own parameters at the size
an all-gather over the data-parallel ranks makes them: whole, or a tensor-parallel rank's share of
a split layer), and (2) the activations the model's forward keeps for backward, counted by
`torch.autograd.graph.saved_tensors_hooks` during each training forward (every storage once;
parameters and their views are left out: they are the gathered units, not activations). Written
to probe_rank<R>.json in the run directory at the end.

    python train.py ... +callbacks.probe._target_=mesh_probe.MeshProbe trust.allow=[mesh_probe.]
    (with benchmarks/ on PYTHONPATH)
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from framework.callbacks.base import Callback

TENSOR_PARALLEL = "tensor_parallel"  # the mesh dimension model_parallel splits layers over


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def gathered_bytes(p: nn.Parameter) -> int:
    """The parameter's size after FSDP's all-gather: divided by the tensor-parallel ranks where a
    tensor-parallel dimension shards it, whole otherwise."""
    if not isinstance(p, DTensor):
        return p.numel() * p.element_size()
    names = p.device_mesh.mesh_dim_names or ()
    split = 1
    for i, placement in enumerate(p.placements):
        # Shard or _StridedShard (a fused layer's thirds), which is no Shard and says is_shard() False
        if getattr(placement, "dim", None) is not None and i < len(names) and names[i] == TENSOR_PARALLEL:
            split *= p.device_mesh.size(i)
    return p.numel() * p.element_size() // split


def largest_unit(model: nn.Module) -> tuple[int, int]:
    """(bytes, number of units): the largest FSDP unit's own parameters as gathered."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not units:
        return 0, 0
    owned: dict[int, int] = {}
    for unit in units:  # a parameter belongs to the innermost unit that holds it
        for p in unit.parameters():
            owned[id(p)] = id(unit)
    sizes = {id(u): 0 for u in units}
    for p in model.parameters():
        if id(p) in owned:
            sizes[owned[id(p)]] += gathered_bytes(p)
    return max(sizes.values()), len(units)


class MeshProbe(Callback):
    def __init__(self) -> None:
        self.saved_per_forward: list[int] = []
        self.unit = (0, 0)

    def on_fit_start(self, loop) -> None:
        model = loop.model
        self.unit = largest_unit(model)
        state: dict = {}

        def parameter_storages() -> set[int]:
            return {_local(p).untyped_storage().data_ptr() for p in model.parameters()}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = _local(t).untyped_storage()
            key = storage.data_ptr()
            if key not in state["seen"] and key not in state["params"]:
                state["seen"].add(key)
                state["bytes"] += storage.nbytes()
            return t

        def before(module, args):
            if not torch.is_grad_enabled():
                return  # validation
            state.update(seen=set(), bytes=0, params=parameter_storages())
            state["hooks"] = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
            state["hooks"].__enter__()

        def after(module, args, output):
            if "hooks" in state:
                state.pop("hooks").__exit__(None, None, None)
                self.saved_per_forward.append(state["bytes"])

        def refresh_params(module, args):
            # the parameters as they are now (a unit's gathered ones while it runs): a gathered
            # unit freed after its forward may leave its address to a later activation
            if "hooks" in state:
                state["params"] = parameter_storages()

        model.register_forward_pre_hook(before)
        model.register_forward_hook(after)
        for module in model.modules():
            if module is not model:
                module.register_forward_pre_hook(refresh_params)

    def on_fit_end(self, loop) -> None:
        rank = int(os.environ.get("RANK", 0))
        (Path(loop.output_dir) / f"probe_rank{rank}.json").write_text(json.dumps({
            "largest_unit_bytes": self.unit[0], "units": self.unit[1],
            "saved_activation_bytes": max(self.saved_per_forward, default=0)}))
