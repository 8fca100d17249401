"""What a parallel dimension is, declared once: a `Dimension` descriptor says everything the mesh
strategy needs to know about it, and ParallelDims, DimsSettings, the resolver, the device mesh, the
data each rank reads, the states FSDP2 shards and the strategy's keys all follow from the
descriptors listed in framework/strategy/mesh/dims.py's DIMENSIONS.

A new dimension is one file (its descriptor and its resolve step) and one entry in DIMENSIONS;
tests/strategy/test_dimension_declared_once.py adds a sixth one that way and trains with it. What
a dimension *does* to the model (split layers, split attention, spread experts) stays its
applier's (framework/strategy/mesh/applier.py).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional

from framework.config.types import PositiveInt
from framework.errors import indivisible, refuse

#: what a dimension's ranks do with the data:
#: "batches": they read different batches (data parallelism: replicate, shard);
#: "sequence": they read the same batches, each keeping a share of every sequence (context);
#: "same": they compute the same tokens together (tensor, pipeline: each holds a part of the model);
#: "borrowed": not a dimension of the device mesh, ranks borrowed from another (expert)
DataRole = Literal["batches", "sequence", "same", "borrowed"]

#: where FSDP2 puts a dimension: "shard" (its ranks hold different shards of the states), "replicate"
#: (its ranks hold copies: hybrid sharding's outer dimension), None (FSDP2 does not see it)
StateRole = Optional[Literal["shard", "replicate"]]


@dataclass(frozen=True)
class Dimension:
    """One parallel dimension of the mesh strategy."""

    #: its name on the device mesh and in ParallelDims ("context")
    name: str
    #: how its size is resolved: `step(settings, taking)` takes its ranks from `taking` (read the
    #: settings with `settings.<setting>`, refuse with framework/errors.py's `indivisible`)
    step: Callable[[Any, "Taking"], None]  # (DimsSettings, Taking)
    #: what its ranks do with the data (DataRole)
    data: DataRole
    #: its place on the device mesh, outermost (slowest link) first; None: not a mesh dimension
    mesh_position: float | None
    #: how `framework plan` and the logs name it in the mesh line, from the resolved sizes (None or
    #: "": it is not named, e.g. at size 1)
    describe: Callable[[Any], Optional[str]] = lambda dims: None  # ParallelDims -> text
    #: the DimsSettings field its step reads (default: its name) and that field's default
    setting: str = ""
    default: Any = 1
    #: the strategy key that sets it on every preset of the mesh strategy ("context_parallel_size");
    #: None: the presets that have it set it through DimsSettings from their own keys
    key: str | None = None
    #: the key's description (docs/reference, the key check's messages)
    help: str = ""
    #: where FSDP2 puts it (StateRole)
    states: StateRole = None
    #: on the device mesh even at size 1 (FSDP2 always shards over `shard`)
    always_on_mesh: bool = False
    #: named after the ranks in the mesh line (", experts spread over groups of 2"), not among them
    trailing: bool = False

    @property
    def setting_name(self) -> str:
        return self.setting or self.name

    def keyword(self) -> inspect.Parameter:
        """Its strategy key as a keyword parameter (framework/config/targets.py reads it)."""
        return inspect.Parameter(self.key, inspect.Parameter.KEYWORD_ONLY, default=self.default,
                                 annotation=PositiveInt)


@dataclass
class Taking:
    """The resolver's state: the ranks no dimension has taken yet, in all and on one node, the sizes
    taken so far (a step may leave an intermediate one, e.g. `data`: the data-parallel ranks that
    shard and replicate then split), and what the dimensions that took their share first took."""

    ranks: int
    devices: int
    sizes: dict[str, int] = field(default_factory=dict)
    taken_first: list[str] = field(default_factory=list)

    def take(self, name: str, size: int) -> None:
        self.sizes[name] = size

    def take_first(self, name: str, key: str, size: int) -> None:
        """`size` ranks of every group of the others for `name` (set by `key`), before the others
        resolve: they then share the ranks (and each node's devices) left."""
        refuse(indivisible(f"{key}={size}", size, self.ranks, ranks_phrase(self.ranks), "choose a size that divides them."))
        self.take(name, size)
        if size > 1:
            self.taken_first.append(f"{key}={size} takes its share first: {self.ranks} ranks / {size}")
        self.ranks, self.devices = self.ranks // size, max(self.devices // size, 1)


def ranks_phrase(world_size: int) -> str:
    return f"the {world_size} ranks (devices x num_nodes)"
