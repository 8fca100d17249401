"""2-D parallelism, FSDP2 over data-parallel ranks x tensor parallelism: strategy=model_parallel's
mesh (framework/strategy/model_parallel.py), and the inner two dimensions of strategy=pipeline's.

The ranks form a (data_parallel, tensor_parallel) mesh. Within a tensor-parallel group every
rank computes the same batch with its share of each split layer (heads, MLP hidden units:
framework/construction/tensor_parallel.py), so a layer's weights and activations are divided
among them; across the groups FSDP2 shards what remains and each group reads its own share of
the data. Built on the meta device and materialised shard by shard, as fsdp is.
"""
from __future__ import annotations

import logging
from typing import Literal

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from framework.config.types import PositiveInt
from framework.construction import tensor_parallel
from framework.errors import ConfigError
from framework.strategy.base import DataParallel
from framework.strategy.fsdp import FSDPStrategy
from framework.tensors import map_tensors, strided_whole, write_part

MESH_DIMS = ("data_parallel", "tensor_parallel")


# A fused layer (colwise_fused3) is split into thirds by tensor parallelism (a strided shard) and
# its rank's part split again by FSDP2. DTensor's own gathers and redistributions get that nested
# layout wrong (measured: the gathered q/k/v rows out of order at 2x2), so checkpoints gather and
# place those tensors here, one dimension of the mesh at a time, as the layout was made
# (framework/tensors.py's local_part/write_part are the inverse).
def _fused(tensor) -> bool:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import _StridedShard

    return isinstance(tensor, DTensor) and isinstance(tensor.placements[-1], _StridedShard)


def _gather_fused(tensor) -> torch.Tensor:
    """Collective over the mesh: the whole of a fused layer's DTensor, on every rank. The
    tensor-parallel thirds are gathered by hand (framework/tensors.py strided_whole): DTensor's
    own gather of a lone strided shard fails from torch 2.11 on."""
    from torch.distributed.tensor import DTensor, Shard

    mesh, part = tensor.device_mesh, tensor.to_local()
    rows = tensor.shape[0] // mesh.size(mesh.ndim - 1)  # this tensor-parallel rank's rows, before FSDP split them
    for dim in range(mesh.ndim - 1):  # the data-parallel split of this rank's rows
        shape = (rows, *tensor.shape[1:])
        part = DTensor.from_local(part, mesh[mesh.mesh_dim_names[dim]], [Shard(0)], shape=shape,
                                  stride=torch.empty(shape, device="meta").stride()).full_tensor()
    tp = mesh[mesh.mesh_dim_names[-1]] if mesh.ndim > 1 else mesh
    parts = [torch.empty_like(part) for _ in range(tp.size())]
    dist.all_gather(parts, part.contiguous(), group=tp.get_group())
    strided = tensor.placements[-1]
    return strided_whole(parts, strided.dim, strided.split_factor)


def global_norm(grads: list, device: torch.device) -> torch.Tensor:
    """The 2-norm of all `grads` together: each rank's squares summed over its local parts, then
    over the mesh dimensions each tensor is split along (not those it is replicated on), one
    all-reduce per group of tensors split alike. By hand rather than DTensor's norm, which from
    torch 2.11 on misreads the fused layers' strided shards (measured: 1.874 instead of 2.0 at step 1
    of a 2x2 run)."""
    from torch.distributed.tensor import DTensor, Replicate

    sums: dict = {}
    for grad in grads:
        if isinstance(grad, DTensor) and any(p.is_partial() for p in grad.placements):
            # still to be summed over ranks (a sequence-parallel norm's weight): summed first
            grad = grad.redistribute(placements=[Replicate() if p.is_partial() else p for p in grad.placements])
        if isinstance(grad, DTensor):
            mesh = grad.device_mesh
            split = tuple(d for d, placement in enumerate(grad.placements) if not isinstance(placement, Replicate))
            key, local = (id(mesh), split), grad.to_local()
            sums.setdefault(key, [mesh, split, torch.zeros((), dtype=torch.float32, device=device)])
        else:
            key, local = (None, ()), grad
            sums.setdefault(key, [None, (), torch.zeros((), dtype=torch.float32, device=device)])
        sums[key][2] = sums[key][2] + local.detach().float().pow(2).sum()
    total = torch.zeros((), dtype=torch.float32, device=device)
    for mesh, split, squares in sums.values():
        for dim in split:
            dist.all_reduce(squares, group=mesh.get_group(dim))
        total = total + squares
    return total.sqrt()


def whole_tensor(value):
    """Collective for a DTensor: the whole tensor on the CPU (a fused layer's gathered by hand);
    anything else as it is."""
    from torch.distributed.tensor import DTensor

    if _fused(value):
        return _gather_fused(value).cpu()
    if isinstance(value, DTensor):
        return value.full_tensor().cpu()
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def _contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` unchanged, unless it is a fused layer's: then a copy whose rows are split over the
    data-parallel ranks and whole on each tensor-parallel rank, a layout DCP describes."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    if not _fused(tensor):
        return tensor
    layout = [Shard(0)] * (tensor.device_mesh.ndim - 1) + [Replicate()]
    return distribute_tensor(_gather_fused(tensor), tensor.device_mesh, layout, src_data_rank=None)


class FSDPTensorParallelStrategy(FSDPStrategy):
    """FSDP2 x tensor parallelism on a 2-D device mesh (Lightning's ModelParallelStrategy,
    torchtitan's FSDP x TP). The loop talks to it as to fsdp; the loader deals the data in
    `data_parallel_size` shares and the ranks of a tensor-parallel group share theirs."""

    name = "model_parallel"
    #: tensor parallelism splits the model's layers themselves (the compatibility table reads it)
    splits_layers = True

    def __init__(self, *args, tensor_parallel_size: PositiveInt | Literal["auto"] = "auto",
                 data_parallel_size: PositiveInt | Literal["auto"] = "auto", sequence_parallel: bool = False,
                 tp_plan: dict[str, str] | None = None, **kwargs):
        """tensor_parallel_size: ranks that split each layer ('auto': the devices of one node, so
        the layers' frequent collectives stay on the fast link); data_parallel_size: groups that
        read different batches and shard the rest with FSDP2 ('auto': the ranks over the
        tensor-parallel size); sequence_parallel: the norms and the activations between split
        layers also split along the sequence (less activation memory; the model's plan must say
        where: the built-in GPT's does); tp_plan: {module name or glob: style} to split a model
        that has no plan of its own, or to replace its plan (styles:
        framework/construction/tensor_parallel.py). The fsdp keys apply to the data-parallel
        sharding."""
        super().__init__(*args, **kwargs)
        self.tensor_parallel_size = tensor_parallel_size
        self.data_parallel_size_setting = data_parallel_size
        self.sequence_parallel = sequence_parallel
        self.tp_plan = None if tp_plan is None else dict(tp_plan)
        self._mesh = None

    def setup_environment(self) -> None:
        super().setup_environment()
        # DTensor logs a warning on every rank whenever a 2-D parameter is gathered in two steps
        # (a checkpoint, the gradient norm): how a 2-D mesh works, not something a user can act on
        logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)

    # ---- the mesh ---------------------------------------------------------------------------
    def mesh_shape(self, world_size: int) -> tuple[int, int]:
        """(data-parallel size, tensor-parallel size) for `world_size` ranks, 'auto' resolved."""
        tp = self.devices if self.tensor_parallel_size == "auto" else int(self.tensor_parallel_size)
        if self.tensor_parallel_size == "auto" and self.data_parallel_size_setting != "auto":
            tp = world_size // max(int(self.data_parallel_size_setting), 1)
        if tp < 1 or world_size % tp:
            given = f"auto ({tp})" if self.tensor_parallel_size == "auto" else tp
            raise ConfigError(f"strategy.tensor_parallel_size={given} does not divide the "
                              f"{world_size} ranks (devices x num_nodes); choose a size that divides them.")
        dp = world_size // tp if self.data_parallel_size_setting == "auto" else int(self.data_parallel_size_setting)
        if dp * tp != world_size:
            raise ConfigError(f"strategy.data_parallel_size={self.data_parallel_size_setting} x "
                              f"strategy.tensor_parallel_size={tp} is {dp * tp} ranks, but the run has {world_size} "
                              "(devices x num_nodes); make their product the number of ranks, or set one to 'auto'.")
        return dp, tp

    def _planned_world(self) -> int:
        return self.devices * self.num_nodes

    @property
    def mesh(self):
        """The (data_parallel, tensor_parallel) DeviceMesh, made on first use in a worker."""
        if self._mesh is None:
            self._mesh = init_device_mesh(self.root_device.type, self.mesh_shape(self.world_size), mesh_dim_names=MESH_DIMS)
        return self._mesh

    def shard_mesh(self):
        return self.mesh["data_parallel"]

    @property
    def data_parallel(self) -> DataParallel:
        """The data-parallel groups' shares; the first rank of each tensor-parallel group reports."""
        dp, tp = self.mesh_shape(self.world_size)
        return DataParallel(dp, self.global_rank // tp, self.global_rank % tp == 0)

    # ---- the plan ---------------------------------------------------------------------------
    def plan(self, model: torch.nn.Module) -> tuple[dict[str, str], str]:
        """(the tensor-parallel plan of `model` as {glob: style}, where it came from)."""
        return tensor_parallel.plan_for(model, self.tp_plan, self.sequence_parallel)

    def problems(self, model: torch.nn.Module | None) -> list[str]:
        try:
            _, tp = self.mesh_shape(self._planned_world())
        except ConfigError as err:
            return [str(err)]
        found = super().problems(model)
        if model is not None:
            plan, source = self.plan(model)
            label = f"auto ({tp})" if self.tensor_parallel_size == "auto" else str(tp)
            found += tensor_parallel.plan_problems(model, plan, source or "strategy.tp_plan", tp, self.sequence_parallel,
                                                   label)
        return found

    def describe_mesh(self, world_size: int) -> str:
        dp, tp = self.mesh_shape(world_size)
        return f"{dp} data-parallel x {tp} tensor-parallel ranks"

    def describe_layout(self, world_size: int, model) -> list[str]:
        lines = [f"mesh: {self.describe_mesh(world_size)}: each batch computed by {self.mesh_shape(world_size)[1]} "
                 "rank(s) together, the states of the split layers divided over every rank, the rest over the "
                 "data-parallel ranks (the estimate below divides all of them by every rank)"]
        if model is not None:
            plan, source = self.plan(model)
            chosen = tensor_parallel.expand(model, plan)
            layers = {name: style for name, style in chosen.items() if style in tensor_parallel.LINEAR_STYLES}
            styles: dict[str, int] = {}
            for style in layers.values():
                styles[style] = styles.get(style, 0) + 1
            split = sum(p.numel() for name in layers for p in model.get_submodule(name).parameters(recurse=False))
            norms = sum(style == "sequence_parallel" for style in chosen.values())
            lines.append(f"tensor parallel: {len(layers)} layers split by {source or 'no plan'} ("
                         + ", ".join(f"{n} {style}" for style, n in styles.items())
                         + f"); {split:,} parameters split, {sum(p.numel() for p in model.parameters()) - split:,} "
                         "whole on each tensor-parallel rank"
                         + (f"; sequence parallel: {norms} norms on a share of the positions"
                            if self.sequence_parallel else ""))
        return lines

    # ---- wrapping: tensor parallel first, then FSDP2 over the data-parallel ranks -------------
    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        plan, source = self.plan(model)
        split = tensor_parallel.parallelize(model, self.mesh["tensor_parallel"], plan, self.sequence_parallel)
        self._say(f"{self.name}: {self.describe_mesh(self.world_size)}; {len(split)} modules split by {source}"
                  f"{' with sequence parallelism' if self.sequence_parallel else ''}")
        return super().wrap_model(model)

    # ---- checkpoints: fused layers gathered and placed here (see _fused) ----------------------
    def _fused_state(self, model, optimizer=None) -> dict[str, dict]:
        """{parameter name: {"param": its DTensor, state name: optimizer state DTensor}} of the fused layers."""
        found = {name: {"param": p} for name, p in self.unwrap(model).named_parameters() if _fused(p)}
        if optimizer is not None:
            by_param = {id(entry["param"]): entry for entry in found.values()}
            for param, state in optimizer.state.items():
                entry = by_param.get(id(param))
                if entry is not None:
                    entry.update({k: v for k, v in state.items() if _fused(v)})
        return found

    def model_state_dict(self, model) -> dict:
        """The full state gathered tensor by tensor from each rank's own (DCP's full-state gather
        would redistribute the fused layers' strided shards, which it cannot: see _gather_fused);
        rank zero receives it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        own = get_model_state_dict(model, options=StateDictOptions(full_state_dict=False))
        state = {name: whole_tensor(value) for name, value in own.items()}  # collective: every rank gathers
        return state if self.is_global_zero else {}

    def optimizer_state_dict(self, model, optimizer) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        own = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=False))
        state = {"state": {name: {key: whole_tensor(value) for key, value in entry.items()}
                           for name, entry in own["state"].items()},
                 "param_groups": own["param_groups"]}
        return state if self.is_global_zero else {}

    def load_model_state_dict(self, model, state: dict) -> None:
        super().load_model_state_dict(model, state)
        for name, entry in self._fused_state(model).items():
            if name in state:
                write_part(state[name], entry["param"])

    def load_optimizer_state_dict(self, model, optimizer, state: dict) -> None:
        super().load_optimizer_state_dict(model, optimizer, state)
        for name, entry in self._fused_state(model, optimizer).items():
            for key, tensor in entry.items():
                if key != "param" and key in state["state"].get(name, {}):
                    write_part(state["state"][name][key], tensor)

    # ---- sharded checkpoints (checkpoint_io=dcp) ----------------------------------------------
    def sharded_state_dict(self, model, optimizer) -> dict:
        """As fsdp's, but a fused layer's split thirds (a strided shard, which DCP cannot describe
        as one chunk per rank) laid out as one contiguous chunk per data-parallel rank (copies:
        loading places them back, framework/strategy/base.py)."""
        return map_tensors(super().sharded_state_dict(model, optimizer), _contiguous)

    def clip_gradients(self, model, optimizer, max_norm=None, max_value=None, parameters=None):
        """Parameters live on two meshes (split ones on both dimensions, the rest on the
        data-parallel one): the norm is taken per mesh and combined."""
        if max_norm is None:
            return super().clip_gradients(model, optimizer, None, max_value, parameters)
        parameters = [p for p in (model.parameters() if parameters is None else parameters) if p.grad is not None]
        if max_value is not None:
            super().clip_gradients(model, optimizer, None, max_value, parameters)
        else:
            self.precision.unscale_gradients(optimizer)
        by_mesh: dict = {}
        for p in parameters:
            by_mesh.setdefault(getattr(p.grad, "device_mesh", None), []).append(p)
        total = global_norm([p.grad for p in parameters], self.root_device)
        for group in by_mesh.values():  # foreach kernels take one mesh at a time
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
        return total
