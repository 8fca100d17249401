"""The one parallel-dims spec: how a run's ranks are laid out on a device mesh.

Every layout of the FSDP2 family is a point of this spec: fsdp is (shard=N), hsdp (replicate x
shard), model_parallel (shard x tensor), pipeline (pipeline x shard x tensor). The sizes are
resolved once from the option's settings ('auto' included), every divisibility rule is checked here
and nowhere else, and the device mesh is built from the result. The mesh's dimensions, outermost
first: pipeline, replicate, shard, tensor (a rank's neighbours on the innermost dimension are the
closest: one node's devices for the tensor-parallel group). `expert` ranks are borrowed from the
shard dimension (torchtitan's way): consecutive shard ranks of one stage group and one tensor place
spread a mixture of experts' experts among them (framework/strategy/mesh/experts.py), on a mesh of
their own. `context` ranks split every sequence of their group's batch between them
(framework/strategy/mesh/context.py); they read the same batches, and FSDP shards over shard x
context.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal, Union

from torch.distributed.device_mesh import init_device_mesh

from framework.errors import ConfigError
from framework.strategy.base import DataParallel

Size = Union[int, Literal["auto"]]

#: the mesh's dimensions, outermost first
DIMS = ("pipeline", "replicate", "shard", "context", "tensor")


@dataclass(frozen=True)
class ParallelDims:
    """Resolved sizes; their product is the world size."""

    pipeline: int = 1
    replicate: int = 1
    shard: int = 1
    tensor: int = 1
    expert: int = 1
    context: int = 1

    @property
    def world_size(self) -> int:
        return self.pipeline * self.replicate * self.shard * self.context * self.tensor

    @property
    def data_parallel(self) -> int:
        """Groups that read different batches: the replicas times the shards of each."""
        return self.replicate * self.shard

    def token_ranks(self, group_of):
        """The ranks that read different tokens, where not the whole world: None where they are
        (no tensor ranks, no stages), "single" where each rank alone, else `group_of()` (the
        data-parallel x context ranks' group)."""
        if self.tensor == 1 and self.pipeline == 1:
            return None
        return "single" if self.shard * self.context == 1 else group_of()

    def coordinates(self, rank: int) -> dict[str, int]:
        """`rank`'s place on each dimension (row-major over DIMS)."""
        place = {}
        for name in reversed(DIMS):
            size = getattr(self, name)
            place[name] = rank % size
            rank //= size
        return place

    def data_share(self, rank: int) -> DataParallel:
        """`rank`'s share of the data: the ranks of one pipeline, of one context group and of one
        tensor-parallel group compute the same batches; the first stage's first tensor ranks report
        (each context rank its part of the scores)."""
        at = self.coordinates(rank)
        return DataParallel(self.data_parallel, at["replicate"] * self.shard + at["shard"],
                            at["pipeline"] == 0 and at["tensor"] == 0, whole_rows=self.context == 1)

    def mesh_dims(self, always: tuple[str, ...] = ("shard",)) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The device mesh's dimension names and sizes: those in `always` (shard: FSDP2 shards over
        it, one rank included; a pipeline's, one stage group included), the others where they are
        larger than 1."""
        names = tuple(name for name in DIMS if name in always or getattr(self, name) > 1)
        return names, tuple(getattr(self, name) for name in names)

    def build_mesh(self, device_type: str, always: tuple[str, ...] = ("shard",)):
        names, sizes = self.mesh_dims(always)
        return init_device_mesh(device_type, sizes, mesh_dim_names=names)

    def build_expert_mesh(self, device_type: str, tensor_dim: bool = False):
        """The experts' mesh: (expert_replica, expert[, expert_tensor]) within this rank's pipeline
        stage group. The expert groups are consecutive ranks of the shard dimension with the same
        tensor-parallel place (which compute the same tokens: each such slice dispatches on its
        own). `tensor_dim`: expert_tensor kept at size 1 too (transformers' dispatch asks for it)."""
        names = ("pipeline", "expert_replica", "expert", "expert_tensor")
        sizes = (self.pipeline, self.replicate * self.shard // self.expert, self.expert, self.tensor)
        always = ("expert_replica", "expert", "expert_tensor") if tensor_dim else ("expert_replica", "expert")
        kept = [i for i, n in enumerate(names) if n in always or sizes[i] > 1]
        mesh = init_device_mesh(device_type, tuple(sizes[i] for i in kept), mesh_dim_names=tuple(names[i] for i in kept))
        return mesh[tuple(n for n in names[1:] if n in mesh.mesh_dim_names)] if self.pipeline > 1 else mesh

    def describe(self) -> str:
        parts = [f"{self.pipeline} pipeline"] if self.pipeline > 1 else []
        if self.replicate > 1:
            parts.append(f"{self.replicate} replica(s) x {self.shard} shard(s)")
        else:
            parts.append(f"{self.shard} data-parallel")
        if self.context > 1:
            parts.append(f"{self.context} context-parallel")
        if self.tensor > 1:
            parts.append(f"{self.tensor} tensor-parallel")
        experts = f", experts spread over groups of {self.expert}" if self.expert > 1 else ""
        return " x ".join(parts) + " ranks" + experts


@dataclass(frozen=True)
class DimsSettings:
    """The sizes as an option's keys give them (each an int or 'auto'), before resolving.

    pipeline: strategy.pipeline_parallel_size ('auto': the ranks the others leave); data_parallel:
    strategy.data_parallel_size ('auto': the ranks the others leave); tensor:
    strategy.tensor_parallel_size ('auto': the devices of one node the others allow, 1 when the
    pipeline is 'auto'); shard: strategy.shard_size (None: the data-parallel ranks all shard, no
    replicas; 'auto': one node's devices); expert: strategy.expert_parallel_size (ranks of the
    shard dimension that spread a mixture of experts' experts; 'auto' tensor is then 1); context:
    strategy.context_parallel_size (ranks that split every sequence; taken before the others are
    resolved, from the ranks and from each node's devices)."""

    pipeline: Size = 1
    data_parallel: Size = "auto"
    tensor: Size = 1
    shard: Size | None = None
    expert: int = 1
    context: int = 1

    def resolve(self, world_size: int, devices: int) -> ParallelDims:
        """The sizes for `world_size` ranks of `devices` per node; ConfigError naming the keys."""
        if world_size % self.context:
            raise ConfigError(f"strategy.context_parallel_size={self.context} does not divide the {world_size} ranks "
                              "(devices x num_nodes); choose a size that divides them.")
        if self.context > 1:
            try:
                rest = replace(self, context=1).resolve(world_size // self.context, max(devices // self.context, 1))
            except ConfigError as err:
                raise ConfigError(f"{err} (strategy.context_parallel_size={self.context} takes its share first: "
                                  f"{world_size} ranks / {self.context})") from None
            return replace(rest, context=self.context)
        tensor = 1 if self.expert > 1 and self.tensor == "auto" else self.tensor  # the experts take the ranks
        pp, dp, tp = _pipeline_data_tensor(world_size, devices, self.pipeline, self.data_parallel, tensor)
        if self.shard is None:
            return _with_experts(ParallelDims(pipeline=pp, shard=dp, tensor=tp), self.expert)
        shard = devices if self.shard == "auto" else int(self.shard)
        if devices % shard or dp % shard:
            given = f"auto ({shard})" if self.shard == "auto" else shard
            raise ConfigError(f"strategy.shard_size={given} does not divide the {devices} ranks of a node (devices): "
                              "a shard group must not span two nodes. Choose a size that divides devices, or "
                              "shard_size=auto (one node).")
        if dp // shard > 1 and (pp > 1 or tp > 1):
            raise ConfigError("replicas of a sharded group (strategy.shard_size) with pipeline stages or tensor "
                              "parallelism: not supported yet; use strategy=hsdp without them, or drop shard_size.")
        return _with_experts(ParallelDims(pipeline=pp, replicate=dp // shard, shard=shard, tensor=tp), self.expert)


def _with_experts(dims: ParallelDims, expert: int) -> ParallelDims:
    """`dims` with `expert` ranks borrowed from its shard dimension, which they must divide."""
    if expert == 1:
        return dims
    if dims.shard % expert:
        raise ConfigError(f"strategy.expert_parallel_size={expert} does not divide the {dims.shard} ranks that shard "
                          "the model (the data-parallel ranks, or strategy.shard_size under hsdp); choose a size that "
                          "divides them.")
    return replace(dims, expert=expert)


def _pipeline_data_tensor(world_size: int, devices: int, pipeline: Size, data_parallel: Size,
                          tensor: Size) -> tuple[int, int, int]:
    """(pipeline, data-parallel, tensor-parallel sizes), 'auto' resolved: tensor 'auto' the devices
    of one node that the ranks over the other two allow (1 when the pipeline itself is 'auto', every
    rank a stage); pipeline 'auto' the ranks the other two leave; data parallel 'auto' the rest."""
    if tensor != "auto":
        tp = int(tensor)
    elif pipeline == "auto":
        tp = 1
    elif data_parallel != "auto":
        tp = world_size // max(int(pipeline) * int(data_parallel), 1)
    else:  # within a node, so the layers' frequent collectives stay on the fast link
        tp = math.gcd(devices, world_size // max(int(pipeline), 1)) or 1
    dp = None if data_parallel == "auto" else int(data_parallel)
    pp = world_size // max(tp * (dp or 1), 1) if pipeline == "auto" else int(pipeline)
    tp_label = f"auto ({tp})" if tensor == "auto" else str(tp)
    if tp < 1 or world_size % tp:
        raise ConfigError(f"strategy.tensor_parallel_size={tp_label} does not divide the {world_size} ranks (devices "
                          "x num_nodes); choose a size that divides them.")
    if pp < 1 or world_size % (pp * tp):
        raise ConfigError(f"strategy.pipeline_parallel_size={pipeline}"
                          + (f" x strategy.tensor_parallel_size={tp_label}" if tp > 1 else "")
                          + f" does not divide the {world_size} ranks (devices x num_nodes); choose a size that "
                          "divides them (the rest become data-parallel groups).")
    if dp is not None and pp * dp * tp != world_size:
        raise ConfigError((f"strategy.pipeline_parallel_size={pipeline} x " if pipeline != 1 else "")
                          + f"strategy.data_parallel_size={dp} x strategy.tensor_parallel_size={tp_label} is "
                          f"{pp * dp * tp} ranks, but the run has {world_size} (devices x num_nodes); make their "
                          "product the number of ranks, or set one of them to 'auto'.")
    return pp, world_size // (pp * tp), tp
