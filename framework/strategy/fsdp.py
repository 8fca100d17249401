"""`strategy=fsdp`: torch FSDP2 (`fully_shard`): parameters, gradients and optimizer state
sharded across ranks, each unit gathered only while it computes. Sharded from birth: the model is
built on the meta device, sharded, and each rank then materialises only its own shards, with the
weights an ordinary build makes from the same seed (framework/construction/meta_init.py). A preset
of the mesh strategy (framework/strategy/mesh/): every rank on the shard dimension."""
from __future__ import annotations

from dataclasses import replace

from framework.config.types import PositiveInt
from framework.construction.units import DEFAULT_MIN_UNIT_PARAMS
from framework.strategy.mesh.dims import DimsSettings
from framework.strategy.mesh.strategy import MeshStrategy


class FSDPStrategy(MeshStrategy):
    """Each unit (framework/construction/units.py: strategy.wrap_modules, the model's sharding_units,
    a Hugging Face model's _no_split_modules, else a size rule) is all-gathered before it runs
    and freed after; the root holds the rest. The precision plugin's compute dtype becomes FSDP's
    MixedPrecisionPolicy (parameters gathered in that dtype, gradients reduced in float32)."""

    name = "fsdp"

    def __init__(self, *args, wrap_modules: list[str] | None = None, min_unit_params: PositiveInt = DEFAULT_MIN_UNIT_PARAMS,
                 reshard_after_forward: bool = True, cpu_offload: bool = False, meta_init: bool = True,
                 timeout_s: float = 1800.0, expert_parallel_size: PositiveInt = 1, dims: DimsSettings | None = None,
                 **kwargs):
        """wrap_modules: class names of the modules to shard as units (e.g. [Block]); null: the
        framework chooses (the model's sharding_units, _no_split_modules, else the size rule);
        []: only the root; min_unit_params: the size rule's threshold; reshard_after_forward: free
        gathered parameters after forward (less memory, one more all-gather in backward);
        cpu_offload: keep sharded parameters, gradients and optimizer state in CPU memory;
        meta_init: build on the meta device and materialise shards only (false: every rank
        builds the whole model first); timeout_s: how long a collective may wait;
        expert_parallel_size: ranks that spread a mixture of experts' experts among them, borrowed
        from the sharding ranks (framework/strategy/mesh/experts.py; 1: every rank every expert)."""
        dims = replace(dims or DimsSettings(), expert=expert_parallel_size)
        super().__init__(*args, wrap_modules=wrap_modules, min_unit_params=min_unit_params,
                         reshard_after_forward=reshard_after_forward, cpu_offload=cpu_offload, meta_init=meta_init,
                         timeout_s=timeout_s, dims=dims, **kwargs)
        self.expert_parallel_size = expert_parallel_size
