"""`strategy=auto`: single_device for one process, ddp for more."""
from __future__ import annotations

import importlib

from framework.strategy.base import Strategy
from framework.strategy.single_device import SingleDeviceStrategy

# (module, class) for a world of more than one process
MULTI_PROCESS_DEFAULT = ("framework.strategy.ddp", "DDPStrategy")


def auto_strategy(accelerator=None, precision=None, checkpoint_io=None, cluster=None,
                  devices="auto", num_nodes: int = 1) -> Strategy:
    """devices / num_nodes: the world to plan for (the YAML passes the top-level keys)."""

    plugins = dict(accelerator=accelerator, precision=precision, checkpoint_io=checkpoint_io, cluster=cluster)
    per_node = accelerator.resolve_devices(devices) if accelerator is not None else 1
    if per_node * num_nodes == 1:
        return SingleDeviceStrategy(**plugins)
    module, cls = MULTI_PROCESS_DEFAULT
    return getattr(importlib.import_module(module), cls)(**plugins)
