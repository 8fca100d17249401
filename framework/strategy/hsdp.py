"""`strategy=hsdp`: hybrid sharding, FSDP2 on a (replicate, shard) mesh: the model states are
sharded within each group of `shard_size` ranks (by default one node, where the link is fast) and
replicated across the groups, so the frequent gathers stay inside a node and only the gradient
all-reduce crosses the slower link between nodes. A preset of the mesh strategy
(framework/strategy/mesh/): the replicate and shard dimensions."""
from __future__ import annotations

from typing import Literal

from framework.config.types import PositiveInt
from framework.strategy.mesh.dims import DimsSettings
from framework.strategy.mesh.strategy import MeshStrategy


class HSDPStrategy(MeshStrategy):
    """FSDP2 with a 2-D mesh (fully_shard's hybrid mode). Everything else is fsdp's: units,
    sharded from birth, mixed precision, checkpoints that move to any strategy."""

    name = "hsdp"

    def __init__(self, *args, shard_size: PositiveInt | Literal["auto"] = "auto", **kwargs):
        """shard_size: ranks that shard the states among them ('auto': the devices of one node);
        it must divide the ranks of a node, so that no shard group spans two nodes. The other keys:
        the mesh strategy's (framework/strategy/mesh/strategy.py)."""
        super().__init__(*args, dims=DimsSettings(shard=shard_size), **kwargs)
        self.shard_size = shard_size
