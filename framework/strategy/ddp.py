"""`strategy=ddp`: torch DistributedDataParallel, one full replica per process."""
from __future__ import annotations

from contextlib import nullcontext

import torch
from torch.nn.parallel import DistributedDataParallel

from framework.config.types import PositiveFloat
from framework.strategy.parallel import ParallelStrategy


class DDPStrategy(ParallelStrategy):
    """Every rank holds the whole model; gradients are averaged in buckets during backward.
    While accumulating, backward runs under `no_sync` so gradients are reduced once per step."""

    name = "ddp"

    def __init__(self, *args, find_unused_parameters: bool | None = None, static_graph: bool = False,
                 gradient_as_bucket_view: bool = True, bucket_cap_mb: PositiveFloat = 25.0,
                 sync_batchnorm: bool = False, timeout_s: float = 1800.0, **kwargs):
        """find_unused_parameters: allow parameters that get no gradient in a step (slower); null:
        only when the task steps its optimizers itself (manual optimization: each optimizer's
        step leaves the other parameters without gradients);
        static_graph: the set of used parameters never changes (enables optimisations);
        gradient_as_bucket_view: gradients alias the communication buckets (saves memory);
        bucket_cap_mb: size of a gradient bucket; sync_batchnorm: BatchNorm statistics over all
        ranks; timeout_s: how long a collective may wait for the others."""
        super().__init__(*args, timeout_s=timeout_s, **kwargs)
        self.ddp_kwargs = {"find_unused_parameters": find_unused_parameters, "static_graph": static_graph,
                           "gradient_as_bucket_view": gradient_as_bucket_view, "bucket_cap_mb": bucket_cap_mb}
        self.sync_batchnorm = sync_batchnorm

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.sync_batchnorm:
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        kwargs = dict(self.ddp_kwargs)
        if kwargs["find_unused_parameters"] is None:
            kwargs["find_unused_parameters"] = self.loop_settings.manual_optimization
        return DistributedDataParallel(model, device_ids=device_ids, **kwargs)

    def no_backward_sync(self, model, skip: bool):
        return model.no_sync() if skip and isinstance(model, DistributedDataParallel) else nullcontext()
