"""The one parallel-dims spec: how a run's ranks are laid out on a device mesh.

Every layout of the FSDP2 family is a point of this spec: fsdp is (shard=N), hsdp (replicate x
shard), model_parallel (shard x tensor), pipeline (pipeline x shard x tensor). Each dimension is
declared once, as a `Dimension` (framework/strategy/mesh/dimension.py) listed in DIMENSIONS: its
resolve step, its place on the mesh, what its ranks do with the data and the states, its key and
how the mesh line names it; ParallelDims, DimsSettings, the resolver, the device mesh, each rank's
share of the data and FSDP2's mesh follow from the list. The sizes are resolved once from the
option's settings ('auto' included) with the ranks' divisibility rules, in DIMENSIONS' order, each
dimension taking its share of the ranks the ones before it left. Every divisibility rule takes one
form (framework/errors.py `indivisible`): those of the ranks are checked here; those that need the
model or the batch (experts per layer, heads and features, microbatches, a sequence's positions)
where the applier that has them does, through it. The mesh's dimensions, outermost first:
pipeline, replicate, shard, context, tensor (the tensor-parallel group the closest ranks). `expert`
ranks are borrowed from the shard dimension (torchtitan's way: framework/strategy/mesh/experts.py),
on a mesh of their own. `context` ranks split every sequence of their group's batch between them
(framework/strategy/mesh/context.py); they read the same batches, and FSDP shards over shard x
context.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Literal, Union

from torch.distributed.device_mesh import init_device_mesh

from framework.errors import ConfigError
from framework.strategy.base import DataParallel
from framework.strategy.mesh.dimension import Dimension, Taking
from framework.strategy.mesh.resolve_steps import _context, _data, _expert, _pipeline, _shard, _tensor

Size = Union[int, Literal["auto"]]


# ---- the dimensions ------------------------------------------------------------------------------
CONTEXT = Dimension(
    "context", _context, data="sequence", mesh_position=3, states="shard", key="context_parallel_size",
    describe=lambda d: f"{d.context} context-parallel" if d.context > 1 else None,
    help="ranks that split every sequence between them, each a head and a tail chunk, attention over the whole "
         "sequence (framework/strategy/mesh/context.py; 1: whole sequences)")
TENSOR = Dimension(
    "tensor", _tensor, data="same", mesh_position=4,
    describe=lambda d: f"{d.tensor} tensor-parallel" if d.tensor > 1 else None)
PIPELINE = Dimension(
    "pipeline", _pipeline, data="same", mesh_position=0,
    describe=lambda d: f"{d.pipeline} pipeline" if d.pipeline > 1 else None)
REPLICATE = Dimension(  # its step leaves the data-parallel ranks, which SHARD's step splits into replicas of shards
    "replicate", _data, data="batches", mesh_position=1, states="replicate", setting="data_parallel", default="auto")
SHARD = Dimension(
    "shard", _shard, data="batches", mesh_position=2, states="shard", default=None, always_on_mesh=True,
    describe=lambda d: (f"{d.replicate} replica(s) x {d.shard} shard(s)" if d.replicate > 1
                        else f"{d.shard} data-parallel"))
EXPERT = Dimension(
    "expert", _expert, data="borrowed", mesh_position=None, key="expert_parallel_size", trailing=True,
    describe=lambda d: f", experts spread over groups of {d.expert}" if d.expert > 1 else None,
    help="ranks that spread a mixture of experts' experts among them, borrowed from the sharding ranks "
         "(framework/strategy/mesh/experts.py; 1: every rank every expert)")

#: every dimension, in the order they take their ranks (a new one: one file and one entry here)
DIMENSIONS: tuple[Dimension, ...] = (CONTEXT, TENSOR, PIPELINE, REPLICATE, SHARD, EXPERT)


def on_mesh() -> list[Dimension]:
    """The dimensions of the device mesh, outermost first."""
    return sorted((d for d in DIMENSIONS if d.mesh_position is not None), key=lambda d: d.mesh_position)


def keyed() -> list[Dimension]:
    """The dimensions every preset of the mesh strategy takes a key for (strategy.<key>)."""
    return [d for d in DIMENSIONS if d.key]


class _PerDimension(ABC):
    """A frozen value per dimension of DIMENSIONS, read as attributes (`dims.context`); the
    subclass says which and their defaults (`_defaults`)."""

    def __init__(self, **values):
        defaults = self._defaults()
        unknown = set(values) - set(defaults)
        if unknown:
            raise TypeError(f"{type(self).__name__}: no {', '.join(sorted(unknown))} (DIMENSIONS give "
                            f"{', '.join(defaults)})")
        object.__setattr__(self, "values", {**defaults, **values})

    @staticmethod
    @abstractmethod
    def _defaults() -> dict:
        """{name: default} of the values it holds, one per dimension."""

    def __getattr__(self, name: str):
        values = self.__dict__.get("values", {})
        if name in values:
            return values[name]
        raise AttributeError(name)

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is frozen: use replace()")

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.values == self.values

    def __hash__(self) -> int:
        return hash(tuple(self.values.items()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(f"{k}={v!r}" for k, v in self.values.items()) + ")"

    def replace(self, **changes):
        return type(self)(**{**self.values, **changes})


class ParallelDims(_PerDimension):
    """Resolved sizes, one per dimension (`dims.context`); their product over the mesh's dimensions
    is the world size."""

    @staticmethod
    def _defaults() -> dict:
        return {d.name: 1 for d in DIMENSIONS}

    @property
    def sizes(self) -> dict[str, int]:
        return self.values

    def _product(self, *roles: str) -> int:
        return math.prod(self.sizes[d.name] for d in DIMENSIONS if d.data in roles)

    @property
    def world_size(self) -> int:
        return self._product("batches", "sequence", "same")

    @property
    def data_parallel(self) -> int:
        """Groups that read different batches: the replicas times the shards of each."""
        return self._product("batches")

    def token_ranks(self, group_of):
        """The ranks that read different tokens, where not the whole world: None where they are
        (no dimension whose ranks compute the same tokens), "single" where each rank alone, else
        `group_of()` (the group of the dimensions whose ranks read different tokens)."""
        if self._product("same") == 1:
            return None
        return "single" if self._product("batches", "sequence") == 1 else group_of()

    def coordinates(self, rank: int) -> dict[str, int]:
        """`rank`'s place on each mesh dimension (row-major, outermost first)."""
        place = {}
        for dim in reversed(on_mesh()):
            size = self.sizes[dim.name]
            place[dim.name] = rank % size
            rank //= size
        return place

    def data_share(self, rank: int) -> DataParallel:
        """`rank`'s share of the data: its index among the groups that read different batches; the
        ranks that compute the same tokens (a pipeline's, a tensor-parallel group's) and those of
        one context group read the same batches, and the first of each report (each context rank
        its part of the scores)."""
        at, index = self.coordinates(rank), 0
        for dim in on_mesh():
            if dim.data == "batches":
                index = index * self.sizes[dim.name] + at[dim.name]
        reports = all(at[d.name] == 0 for d in on_mesh() if d.data == "same")
        return DataParallel(self.data_parallel, index, reports, whole_rows=self._product("sequence") == 1)

    def mesh_dims(self, always: tuple[str, ...] = ()) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The device mesh's dimension names and sizes: those always on it (shard: FSDP2 shards over
        it, one rank included) or in `always` (a pipeline's, one stage group included), the others
        where they are larger than 1."""
        names = tuple(d.name for d in on_mesh() if d.always_on_mesh or d.name in always or self.sizes[d.name] > 1)
        return names, tuple(self.sizes[name] for name in names)

    def build_mesh(self, device_type: str, always: tuple[str, ...] = ()):
        names, sizes = self.mesh_dims(always)
        return init_device_mesh(device_type, sizes, mesh_dim_names=names)

    @property
    def state_shards(self) -> int:
        """The ranks FSDP2 divides the states over (the dimensions whose `states` is "shard")."""
        return math.prod(self.sizes[d.name] for d in DIMENSIONS if d.states == "shard")

    def token_dims(self) -> tuple[str, ...]:
        """The mesh dimensions whose ranks read different tokens (different batches, or parts of one)."""
        return tuple(d.name for d in on_mesh() if d.data in ("batches", "sequence"))

    def state_dims(self, present: tuple[str, ...], role: str) -> tuple[str, ...]:
        """The mesh dimensions (of those `present`) FSDP2 puts in `role` ("shard", "replicate")."""
        return tuple(d.name for d in on_mesh() if d.states == role and d.name in present)

    def describe(self) -> str:
        """The mesh line: each dimension as its descriptor names it, outermost first."""
        parts = [text for d in on_mesh() if not d.trailing and (text := d.describe(self))]
        trailing = "".join(text for d in DIMENSIONS if d.trailing and (text := d.describe(self)))
        return " x ".join(parts) + " ranks" + trailing

    def unnamed(self, lines: tuple[str, ...]) -> tuple[str, ...]:
        """A layout's `lines` led by the mesh line where they go beyond data parallelism and no
        applier's line names the mesh (a dimension without an applier of its own)."""
        named = self.world_size == self.data_parallel or any(self.describe() in line for line in lines)
        return lines if named else (f"mesh: {self.describe()}",) + lines


class DimsSettings(_PerDimension):
    """The sizes as an option's keys give them (each an int or 'auto'), before resolving: one field
    per dimension's `setting` (pipeline: strategy.pipeline_parallel_size, 'auto': the ranks the
    others leave; data_parallel: strategy.data_parallel_size, 'auto': the ranks the others leave;
    tensor: strategy.tensor_parallel_size, 'auto': the devices of one node the others allow, 1 when
    the pipeline is 'auto'; shard: strategy.shard_size, None: the data-parallel ranks all shard, no
    replicas, 'auto': one node's devices; expert: strategy.expert_parallel_size, ranks of the shard
    dimension that spread a mixture of experts' experts, 'auto' tensor is then 1; context:
    strategy.context_parallel_size, ranks that split every sequence, taken before the others are
    resolved, from the ranks and from each node's devices)."""

    @staticmethod
    def _defaults() -> dict:
        return {d.setting_name: d.default for d in DIMENSIONS}

    def resolve(self, world_size: int, devices: int) -> ParallelDims:
        """The sizes for `world_size` ranks of `devices` per node; ConfigError naming the keys. Each
        dimension takes its share, in DIMENSIONS' order, of the ranks the ones before it left."""
        taking = Taking(world_size, devices)
        for dim in DIMENSIONS:
            first = list(taking.taken_first)
            try:
                dim.step(self, taking)
            except ConfigError as err:
                if not first:
                    raise
                raise ConfigError(f"{err} ({'; '.join(first)})") from None
        return ParallelDims(**{name: size for name, size in taking.sizes.items() if name in {d.name for d in DIMENSIONS}})
