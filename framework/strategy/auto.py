"""`strategy=auto`: single_device for one process, ddp for more; on XLA devices (accelerator=xla
or tpu) single_xla for one device, xla_spmd for more."""
from __future__ import annotations

import importlib

from framework.strategy.base import Strategy
from framework.strategy.single_device import SingleDeviceStrategy

# (module, class) for a world of more than one process
MULTI_PROCESS_DEFAULT = ("framework.strategy.ddp", "DDPStrategy")
# (one XLA device, several) on accelerator=xla or tpu
XLA_DEFAULTS = (("framework.strategy.single_xla", "SingleXLAStrategy"),
                ("framework.strategy.xla_spmd", "XLASPMDStrategy"))


def auto_strategy(accelerator=None, precision=None, checkpoint_io=None, cluster=None,
                  devices="auto", num_nodes: int = 1) -> Strategy:
    """devices / num_nodes: the world to plan for (the YAML passes the top-level keys)."""

    plugins = {"accelerator": accelerator, "precision": precision, "checkpoint_io": checkpoint_io, "cluster": cluster}
    per_node = accelerator.resolve_devices(devices) if accelerator is not None else 1
    if getattr(accelerator, "name", None) in ("xla", "tpu"):
        module, cls = XLA_DEFAULTS[per_node * num_nodes > 1]
        return getattr(importlib.import_module(module), cls)(**plugins)
    if per_node * num_nodes == 1:
        return SingleDeviceStrategy(**plugins)
    module, cls = MULTI_PROCESS_DEFAULT
    return getattr(importlib.import_module(module), cls)(**plugins)
