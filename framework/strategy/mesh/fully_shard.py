"""The FSDP2 applier: a model's units, then its root, sharded over the mesh's data-parallel
dimensions (shard; replicate x shard: hybrid), and a model built on the meta device materialised
shard by shard with the initialisation an ordinary build makes (framework/construction/meta_init.py;
a pipeline rank's stages: framework/strategy/mesh/pipeline/run.py)."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import torch
from torch.distributed.device_mesh import DeviceMesh

from framework.construction.meta_init import InitLog, replay
from framework.construction.units import Units
from framework.strategy.abilities import Abilities
from framework.strategy.layout import StateLayout
from framework.strategy.mesh.applier import Applier
from framework.tensors import write_part


def shard_kwargs(mesh, precision, reshard_after_forward: bool, cpu_offload: bool, device: torch.device,
                 ignored: set | None = None) -> dict:
    """fully_shard's arguments: the mesh, when to free gathered parameters, where shards live, the
    precision plugin's compute dtype as FSDP's MixedPrecisionPolicy (gathered in that dtype,
    gradients reduced in float32), and the parameters it leaves alone (spread experts)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward,
              "offload_policy": (CPUOffloadPolicy(pin_memory=device.type == "cuda")  # pinning needs a GPU
                                 if cpu_offload else OffloadPolicy())}
    if ignored:
        kwargs["ignored_params"] = set(ignored)
    dtypes = precision.sharded_param_dtypes()
    if dtypes is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtypes[0], reduce_dtype=dtypes[1])
    return kwargs


def apply_fully_shard(roots: list[torch.nn.Module], units: Units, kwargs: dict) -> None:
    """Each unit inside each root sharded as one, then the root (a pipeline rank's stages are roots
    of their own: the schedule calls the stages, not the rank's part)."""
    from torch.distributed.fsdp import fully_shard

    for root in roots:
        for unit in units.modules:
            if len(roots) == 1 or any(unit is m for m in root.modules()):
                fully_shard(unit, **kwargs)
        fully_shard(root, **kwargs)


def materialise(model: torch.nn.Module, log: InitLog, device: torch.device) -> None:
    """Allocate this rank's shards and fill them with the recorded initialisation."""
    model.to_empty(device=device)

    def write(name: str, full: torch.Tensor) -> None:
        owner, _, leaf = name.rpartition(".")
        target = getattr(model.get_submodule(owner), leaf)
        write_part(full.to(target.dtype), target)

    replay(log, write)


def _one(mesh, names: tuple[str, ...]):
    """`names` of `mesh` as one dimension (flattened, named by them joined, where several)."""
    return mesh[names]._flatten("_".join(names)) if len(names) > 1 else mesh[names[0]]


def data_mesh(mesh, dims):
    """The mesh FSDP2 shards over: the dimensions whose ranks hold different shards of the states
    (framework/strategy/mesh/dims.py's `states`: shard, and context, whose ranks hold different
    positions, as torchtitan's dp_shard_cp) flattened into one, with those that hold copies
    (replicate: hybrid sharding) outside it."""
    inner = _one(mesh, dims.state_dims(mesh.mesh_dim_names, "shard"))
    copies = dims.state_dims(mesh.mesh_dim_names, "replicate")
    return DeviceMesh._concatenate([_one(mesh, copies), inner]) if copies else inner


def token_mesh(mesh, dims):
    """The ranks that read different tokens, as one dimension: the mesh's dimensions whose ranks
    read different batches or different parts of one (replicate x shard x context, those the mesh
    has; a mixture of experts counts its routing over them)."""
    return _one(mesh, tuple(d for d in mesh.mesh_dim_names if d in dims.token_dims()))


class ShardingApplier(Applier):
    """FSDP2 over the data-parallel (x context) ranks, after the layers are split: each unit, then
    each root (the model, or a pipeline rank's stages)."""

    abilities = Abilities(collective_forward=True)  # each unit's weights gathered inside its forward

    def __init__(self, placement, dims):
        super().__init__(placement, dims)
        self.stages = placement.pipeline is not None  # the schedule defers the reduction itself

    @classmethod
    def wanted(cls, placement, dims) -> bool:
        # a pipeline with one data-parallel rank has nothing to shard its stages over
        return placement.pipeline is None or dims is None or dims.data_parallel > 1

    def lines(self, model):
        d = self.dims
        if d.replicate == 1:
            return []
        return [f"mesh: {d.replicate} replica(s) x {d.shard} shard(s): the states are sharded over {d.state_shards} "
                f"rank(s) and replicated {d.replicate} time(s)"]

    def layout(self, layout, model):
        d = self.dims  # hybrid: the states divided over one shard group (x its context ranks)
        layout = replace(layout, states=StateLayout("fully_sharded", offload=self.placement.cpu_offload))
        return replace(layout, state_shards=d.state_shards) if d.replicate > 1 else layout

    def apply(self, model):
        s, d = self.placement, self.dims
        if d.replicate > 1:
            s.say(f"{s.name}: {self.lines(None)[0]}")
        units = s.layout.units(model)  # as its sibling appliers leave them
        roots = s.layout.roots(model)
        if not self.stages:
            s.say(f"{s.name}: sharding units: {units.describe()}")
        kwargs = shard_kwargs(data_mesh(s.mesh, d), s.precision, s.reshard_after_forward,
                              s.cpu_offload, s.root_device, s.layout.ignored_parameters())
        apply_fully_shard(roots, units, kwargs)

    def no_sync(self, model, skip):
        if self.stages:
            return None

        @contextmanager
        def toggled():
            model.set_requires_gradient_sync(not skip)
            yield

        return toggled()
