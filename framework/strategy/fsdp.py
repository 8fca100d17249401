"""`strategy=fsdp`: torch FSDP2 (`fully_shard`): parameters, gradients and optimizer state
sharded across ranks, each unit gathered only while it computes. Sharded from birth: the model is
built on the meta device, sharded, and each rank then materialises only its own shards, with the
weights an ordinary build makes from the same seed (framework/construction/meta_init.py). A preset
of the mesh strategy (framework/strategy/mesh/): every rank on the shard dimension (x experts, x
context ranks where their keys say)."""
from __future__ import annotations

from framework.strategy.mesh.strategy import MeshStrategy


class FSDPStrategy(MeshStrategy):
    """Each unit (framework/construction/units.py: strategy.wrap_modules, the model's sharding_units,
    a Hugging Face model's _no_split_modules, else a size rule) is all-gathered before it runs
    and freed after; the root holds the rest. The precision plugin's compute dtype becomes FSDP's
    MixedPrecisionPolicy (parameters gathered in that dtype, gradients reduced in float32). Its keys:
    the mesh strategy's (framework/strategy/mesh/strategy.py)."""

    name = "fsdp"
