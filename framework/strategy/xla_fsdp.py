"""`strategy=xla_fsdp`: xla_spmd (framework/strategy/xla_spmd.py) with every weight also split
along its first dimension over the devices (fully sharded data parallel in GSPMD, torch_xla's
"FSDP via SPMD"): each device holds 1/N of the weights, and of the gradients and optimizer state,
which take the weights' sharding; the compiler gathers a weight where it is used. A weight whose
first dimension does not divide by the device count stays replicated (said at start).
"""
from __future__ import annotations

from framework.strategy.layout import StateLayout
from framework.strategy.xla_spmd import XLASPMDStrategy


class XLAFSDPStrategy(XLASPMDStrategy):
    """Weights, gradients and optimizer state sharded over this host's XLA devices."""

    name = "xla_fsdp"
    shards_states = True
    states = StateLayout("fully_sharded")  # over every device of every host (one process per host)

    def wrap_model(self, model):
        import torch_xla.distributed.spmd as xs

        split, kept = 0, []
        for name, param in model.named_parameters():
            if param.dim() and param.shape[0] % self.mesh.size() == 0:
                xs.mark_sharding(param, self.mesh, (self.axis,) + (None,) * (param.dim() - 1))
                split += 1
            else:
                kept.append(name)
        if self.is_global_zero:
            print(f"xla_fsdp: {split} weights split over {self.mesh.size()} devices"
                  + (f"; replicated (first dimension not divisible): {', '.join(kept)}" if kept else ""), flush=True)
        return model
