"""`strategy=fsdp`: torch FSDP2 (`fully_shard`): parameters, gradients and optimizer state
sharded across ranks, each wrapped unit gathered only while it computes."""
from __future__ import annotations

import torch

from framework.errors import ConfigError
from framework.strategy.memory import fully_sharded
from framework.strategy.parallel import ParallelStrategy


class FSDPStrategy(ParallelStrategy):
    """Each module whose class name is in `wrap_modules` becomes one FSDP unit (its parameters
    are all-gathered together before it runs and freed after); the root holds the rest.
    The precision plugin's compute dtype becomes FSDP's MixedPrecisionPolicy (parameters
    gathered in that dtype, gradients reduced in float32)."""

    name = "fsdp"

    def __init__(self, *args, wrap_modules: list[str] | None = None, reshard_after_forward: bool = True,
                 cpu_offload: bool = False, timeout_s: float = 1800.0, **kwargs):
        """wrap_modules: class names of the modules to shard as units (e.g. [Block]); null: the
        model's own `sharding_units` attribute if it has one, else only the root; reshard_after_forward: free gathered parameters after forward (less memory,
        one more all-gather in backward); cpu_offload: keep sharded parameters, gradients and
        optimizer state in CPU memory; timeout_s: how long a collective may wait."""
        super().__init__(*args, timeout_s=timeout_s, **kwargs)
        self.wrap_modules = None if wrap_modules is None else list(wrap_modules)
        self.reshard_after_forward = reshard_after_forward
        self.cpu_offload = cpu_offload

    def estimate_memory(self, stats, world_size: int):
        return fully_sharded(stats, world_size, offload=self.cpu_offload)

    def _shard_kwargs(self) -> dict:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

        kwargs = {"mesh": init_device_mesh(self.root_device.type, (self.world_size,)),
                  "reshard_after_forward": self.reshard_after_forward,
                  "offload_policy": (CPUOffloadPolicy(pin_memory=self.root_device.type == "cuda")  # pinning needs a GPU
                                     if self.cpu_offload else OffloadPolicy())}
        dtypes = self.precision.sharded_param_dtypes()
        if dtypes is not None:
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtypes[0], reduce_dtype=dtypes[1])
        return kwargs

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.fsdp import fully_shard

        names = self.wrap_modules if self.wrap_modules is not None else list(getattr(model, "sharding_units", ()))
        units = [m for m in model.modules() if type(m).__name__ in names and m is not model]
        if self.wrap_modules and not units:
            present = sorted({type(m).__name__ for m in model.modules()})
            raise ConfigError(f"strategy.wrap_modules={self.wrap_modules}: the model has no module of these "
                              f"classes; it has: {', '.join(present)}.")
        kwargs = self._shard_kwargs()
        for unit in units:
            fully_shard(unit, **kwargs)
        fully_shard(model, **kwargs)
        return model

    def no_backward_sync(self, model, skip: bool):
        """While accumulating, keep unsharded gradients and reduce-scatter once per step."""
        from contextlib import contextmanager

        @contextmanager
        def toggled():
            model.set_requires_gradient_sync(not skip)
            yield

        return toggled()

    def clip_gradients(self, model, optimizer, max_norm=None, max_value=None, parameters=None):
        norm = super().clip_gradients(model, optimizer, max_norm, max_value, parameters)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm
