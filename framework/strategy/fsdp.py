"""`strategy=fsdp`: torch FSDP2 (`fully_shard`): parameters, gradients and optimizer state
sharded across ranks, each unit gathered only while it computes. Sharded from birth: the model is
built on the meta device, sharded, and each rank then materialises only its own shards, with the
weights an ordinary build makes from the same seed (framework/construction/meta_init.py)."""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.distributed.device_mesh import init_device_mesh

from framework.config.types import PositiveInt
from framework.construction.meta_init import InitLog, build_on_meta, replay
from framework.construction.units import DEFAULT_MIN_UNIT_PARAMS, Units, choose_units
from framework.errors import ConfigError
from framework.strategy.base import with_adapter
from framework.strategy.parallel import ParallelStrategy
from framework.tensors import write_part


class FSDPStrategy(ParallelStrategy):
    """Each unit (framework/construction/units.py: strategy.wrap_modules, the model's sharding_units,
    a Hugging Face model's _no_split_modules, else a size rule) is all-gathered before it runs
    and freed after; the root holds the rest. The precision plugin's compute dtype becomes FSDP's
    MixedPrecisionPolicy (parameters gathered in that dtype, gradients reduced in float32)."""

    name = "fsdp"
    shards_states = True
    requires_torch = "2.6"  # fully_shard (FSDP2) public in torch.distributed.fsdp; the compatibility table reads it
    memory_layout = "fully_sharded"

    def __init__(self, *args, wrap_modules: list[str] | None = None, min_unit_params: PositiveInt = DEFAULT_MIN_UNIT_PARAMS,
                 reshard_after_forward: bool = True, cpu_offload: bool = False, meta_init: bool = True,
                 timeout_s: float = 1800.0, **kwargs):
        """wrap_modules: class names of the modules to shard as units (e.g. [Block]); null: the
        framework chooses (the model's sharding_units, _no_split_modules, else the size rule);
        []: only the root; min_unit_params: the size rule's threshold; reshard_after_forward: free
        gathered parameters after forward (less memory, one more all-gather in backward);
        cpu_offload: keep sharded parameters, gradients and optimizer state in CPU memory;
        meta_init: build on the meta device and materialise shards only (false: every rank
        builds the whole model first); timeout_s: how long a collective may wait."""
        super().__init__(*args, timeout_s=timeout_s, **kwargs)
        self.wrap_modules = None if wrap_modules is None else list(wrap_modules)
        self.min_unit_params = min_unit_params
        self.reshard_after_forward = reshard_after_forward
        self.cpu_offload = cpu_offload
        self.meta_init = meta_init
        self._init_log: InitLog | None = None

    def units(self, model: torch.nn.Module) -> Units:
        """The modules sharded as units (the same rule `framework plan` and `validate` use)."""
        return choose_units(model, self.wrap_modules, self.min_unit_params)

    def problems(self, model: torch.nn.Module | None) -> list[str]:
        if model is None:
            return []
        try:
            self.units(model)
        except ConfigError as err:  # a wrap_modules name the model does not have
            return [str(err)]
        return []

    # ---- building: on the meta device, then shards only --------------------------------
    def build_model(self, factory, adapter=None):
        """On the meta device, the adapter's layers too (their initialisation is recorded with the
        rest and replayed into the shards)."""
        if not self.meta_init:
            return with_adapter(factory(), adapter)
        model, log = build_on_meta(lambda: with_adapter(factory(), adapter))
        if log.problem:
            self._say(f"{self.name}: building {type(model).__name__} whole on every rank before sharding: {log.problem}")
            return with_adapter(factory(), adapter)
        self._init_log = log
        return model

    def _materialise(self, model: torch.nn.Module) -> None:
        """Allocate this rank's shards and fill them with the recorded initialisation."""
        log, self._init_log = self._init_log, None
        model.to_empty(device="cpu" if self.cpu_offload else self.root_device)

        def write(name: str, full: torch.Tensor) -> None:
            owner, _, leaf = name.rpartition(".")
            target = getattr(model.get_submodule(owner), leaf)
            write_part(full.to(target.dtype), target)

        replay(log, write)

    def shard_mesh(self):
        """The device mesh FSDP shards over: every rank (hsdp and model_parallel: a 2-D mesh, or a
        dimension of one)."""
        return init_device_mesh(self.root_device.type, (self.world_size,))

    def _shard_kwargs(self) -> dict:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

        kwargs = {"mesh": self.shard_mesh(),
                  "reshard_after_forward": self.reshard_after_forward,
                  "offload_policy": (CPUOffloadPolicy(pin_memory=self.root_device.type == "cuda")  # pinning needs a GPU
                                     if self.cpu_offload else OffloadPolicy())}
        dtypes = self.precision.sharded_param_dtypes()
        if dtypes is not None:
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtypes[0], reduce_dtype=dtypes[1])
        return kwargs

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.fsdp import fully_shard

        units = self.units(model)
        self._say(f"{self.name}: sharding units: {units.describe()}")
        kwargs = self._shard_kwargs()
        for unit in units.modules:
            fully_shard(unit, **kwargs)
        fully_shard(model, **kwargs)
        if self._init_log is not None:
            self._materialise(model)
        return model

    def _say(self, line: str) -> None:
        if self.is_global_zero:
            print(line, flush=True)

    def no_backward_sync(self, model, skip: bool):
        """While accumulating, keep unsharded gradients and reduce-scatter once per step."""

        @contextmanager
        def toggled():
            model.set_requires_gradient_sync(not skip)
            yield

        return toggled()

    def clip_gradients(self, model, optimizer, max_norm=None, max_value=None, parameters=None):
        norm = super().clip_gradients(model, optimizer, max_norm, max_value, parameters)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm
