"""The one parallel-dims spec: how a run's ranks are laid out on a device mesh.

Every layout of the FSDP2 family is a point of this spec: fsdp is (shard=N), hsdp (replicate x
shard), model_parallel (shard x tensor), pipeline (pipeline x shard x tensor). The sizes are
resolved once from the option's settings ('auto' included) with the ranks' divisibility rules, and
the device mesh is built from the result. Every divisibility rule takes one form (framework/errors.py `indivisible`):
those of the ranks are checked here; those that need the model or the batch (experts per layer,
heads and features, microbatches, a sequence's positions) where the applier that has them does,
through it. The mesh's dimensions, outermost
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
from dataclasses import dataclass, field
from typing import Literal, Union

from torch.distributed.device_mesh import init_device_mesh

from framework.errors import ConfigError, indivisible, refuse
from framework.strategy.base import DataParallel

Size = Union[int, Literal["auto"]]

#: the mesh's dimensions, outermost first
DIMS = ("pipeline", "replicate", "shard", "context", "tensor")


def _ranks(world_size: int) -> str:
    return f"the {world_size} ranks (devices x num_nodes)"


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
        replicate x shard x context ranks' group)."""
        if self.tensor == 1 and self.pipeline == 1:
            return None
        return "single" if self.replicate * self.shard * self.context == 1 else group_of()

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
        """The sizes for `world_size` ranks of `devices` per node; ConfigError naming the keys. Each
        dimension takes its share, in `RESOLVED_IN`'s order, of the ranks the ones before it left."""
        taking = _Taking(world_size, devices)
        for step in RESOLVED_IN:
            try:
                step(self, taking)
            except ConfigError as err:
                if self.context == 1 or step is _context:
                    raise
                raise ConfigError(f"{err} (strategy.context_parallel_size={self.context} takes its share first: "
                                  f"{world_size} ranks / {self.context})") from None
        return ParallelDims(**taking.sizes)


@dataclass
class _Taking:
    """The resolver's state: the ranks no dimension has taken yet, in all and on one node, and the
    sizes taken so far (`data`: the data-parallel ranks, which shard and replicate then split)."""

    ranks: int
    devices: int
    sizes: dict[str, int] = field(default_factory=dict)

    def take(self, name: str, size: int) -> None:
        self.sizes[name] = size


def _context(given: DimsSettings, taking: _Taking) -> None:
    """Context ranks first: they split every sequence of a group's batch, whatever else the group does."""
    c = given.context
    refuse(indivisible(f"strategy.context_parallel_size={c}", c, taking.ranks, _ranks(taking.ranks),
                       "choose a size that divides them."))
    taking.take("context", c)
    taking.ranks, taking.devices = taking.ranks // c, max(taking.devices // c, 1)


def _tensor(given: DimsSettings, taking: _Taking) -> None:
    """'auto': the devices of one node that the ranks over pipeline and data allow, so the layers'
    frequent collectives stay on the fast link (1 when the pipeline itself is 'auto', every rank a
    stage, or when experts take the ranks)."""
    ranks, size = taking.ranks, given.tensor
    if size == "auto" and (given.expert > 1 or given.pipeline == "auto"):
        size = 1
    elif size == "auto" and given.data_parallel != "auto":
        size = ranks // max(int(given.pipeline) * int(given.data_parallel), 1)
    elif size == "auto":
        size = math.gcd(taking.devices, ranks // max(int(given.pipeline), 1)) or 1
    taking.take("tensor", int(size))
    label = f"auto ({size})" if given.tensor == "auto" else str(size)
    refuse(indivisible(f"strategy.tensor_parallel_size={label}", int(size), ranks, _ranks(ranks),
                       "choose a size that divides them."))


def _pipeline(given: DimsSettings, taking: _Taking) -> None:
    """'auto': the ranks tensor and data parallelism leave."""
    ranks, tp = taking.ranks, taking.sizes["tensor"]
    dp = 1 if given.data_parallel == "auto" else int(given.data_parallel)
    pp = ranks // max(tp * dp, 1) if given.pipeline == "auto" else int(given.pipeline)
    taking.take("pipeline", pp)
    label = f"auto ({tp})" if given.tensor == "auto" else str(tp)
    refuse(indivisible(f"strategy.pipeline_parallel_size={given.pipeline}"
                       + (f" x strategy.tensor_parallel_size={label}" if tp > 1 else ""), pp * tp, ranks,
                       _ranks(ranks), "choose a size that divides them (the rest become data-parallel groups)."))


def _data(given: DimsSettings, taking: _Taking) -> None:
    """'auto': the rest; a given size must make the product the ranks."""
    ranks, pp, tp = taking.ranks, taking.sizes["pipeline"], taking.sizes["tensor"]
    if given.data_parallel != "auto" and pp * int(given.data_parallel) * tp != ranks:
        label = f"auto ({tp})" if given.tensor == "auto" else str(tp)
        raise ConfigError((f"strategy.pipeline_parallel_size={given.pipeline} x " if given.pipeline != 1 else "")
                          + f"strategy.data_parallel_size={given.data_parallel} x strategy.tensor_parallel_size={label} "
                          f"is {pp * int(given.data_parallel) * tp} ranks, but the run has {ranks} (devices x "
                          "num_nodes); make their product the number of ranks, or set one of them to 'auto'.")
    taking.take("data", ranks // (pp * tp))


def _shard(given: DimsSettings, taking: _Taking) -> None:
    """The data-parallel ranks as replicas of sharded groups (hsdp: strategy.shard_size ranks of one
    node each), or all one sharded group."""
    dp, devices = taking.sizes.pop("data"), taking.devices
    if given.shard is None:
        taking.take("shard", dp)
        return
    shard = devices if given.shard == "auto" else int(given.shard)
    key = f"strategy.shard_size={f'auto ({shard})' if given.shard == 'auto' else shard}"
    fix = "a shard group must not span two nodes. Choose a size that divides devices, or shard_size=auto (one node)."
    refuse(indivisible(key, shard, devices, f"the {devices} ranks of a node (devices)", fix)
           or indivisible(key, shard, dp, f"the {dp} data-parallel ranks", fix))
    taking.take("replicate", dp // shard)
    taking.take("shard", shard)


def _expert(given: DimsSettings, taking: _Taking) -> None:
    """Expert ranks borrowed from the shard dimension, which they must divide."""
    shard = taking.sizes["shard"]
    refuse(indivisible(f"strategy.expert_parallel_size={given.expert}", given.expert, shard,
                       f"the {shard} ranks that shard the model (the data-parallel ranks, or strategy.shard_size "
                       "under hsdp)", "choose a size that divides them."))
    taking.take("expert", given.expert)


#: the order in which the dimensions take their ranks
RESOLVED_IN = (_context, _tensor, _pipeline, _data, _shard, _expert)
