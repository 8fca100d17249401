"""`strategy=hsdp`: hybrid sharding, FSDP2 on a (replicate, shard) mesh: the model states are
sharded within each group of `shard_size` ranks (by default one node, where the link is fast) and
replicated across the groups, so the frequent gathers stay inside a node and only the gradient
all-reduce crosses the slower link between nodes."""
from __future__ import annotations

from typing import Literal

from torch.distributed.device_mesh import init_device_mesh

from framework.config.types import PositiveInt
from framework.errors import ConfigError
from framework.strategy.fsdp import FSDPStrategy

MESH_DIMS = ("replicate", "shard")


class HSDPStrategy(FSDPStrategy):
    """FSDP2 with a 2-D mesh (fully_shard's hybrid mode). Everything else is fsdp's: units,
    sharded from birth, mixed precision, checkpoints that move to any strategy."""

    name = "hsdp"

    def __init__(self, *args, shard_size: PositiveInt | Literal["auto"] = "auto", **kwargs):
        """shard_size: ranks that shard the states among them ('auto': the devices of one node);
        it must divide the ranks of a node, so that no shard group spans two nodes."""
        super().__init__(*args, **kwargs)
        self.shard_size = shard_size
        self._mesh = None

    def mesh_shape(self, world_size: int) -> tuple[int, int]:
        """(replicas, ranks per shard group) for `world_size` ranks, 'auto' resolved."""
        shard = self.devices if self.shard_size == "auto" else int(self.shard_size)
        if self.devices % shard or world_size % shard:
            given = f"auto ({shard})" if self.shard_size == "auto" else shard
            raise ConfigError(f"strategy.shard_size={given} does not divide the {self.devices} "
                              "ranks of a node (devices): a shard group must not span two nodes. Choose a size that "
                              "divides devices, or shard_size=auto (one node).")
        return world_size // shard, shard

    def state_shards(self, world_size: int) -> int:
        return self.mesh_shape(world_size)[1]

    def describe_layout(self, world_size: int, model) -> list[str]:
        replicas, shard = self.mesh_shape(world_size)
        return [f"mesh: {replicas} replica(s) x {shard} shard(s): the states are sharded over {shard} rank(s) "
                f"and replicated {replicas} time(s)"]

    def problems(self, model) -> list[str]:
        try:
            self.mesh_shape(self.devices * self.num_nodes)
        except ConfigError as err:
            return [str(err)]
        return super().problems(model)

    def wrap_model(self, model):
        self._say(f"{self.name}: {self.describe_layout(self.world_size, model)[0]}")
        return super().wrap_model(model)

    def shard_mesh(self):
        if self._mesh is None:
            self._mesh = init_device_mesh(self.root_device.type, self.mesh_shape(self.world_size),
                                          mesh_dim_names=MESH_DIMS)
        return self._mesh
