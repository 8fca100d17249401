"""Build the plugin objects from a config and compose the first five into the strategy."""
from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from framework.config.build import build


@dataclass
class Plugins:
    accelerator: object
    precision: object
    checkpoint_io: object
    cluster: object
    strategy: object
    fault_tolerance: object


def build_plugins(cfg: DictConfig) -> Plugins:
    """Constructors are side-effect free (no device, no process group), so this is safe in the
    launching process for validation and again in every worker."""
    accelerator = build(cfg.accelerator, "accelerator")
    precision = build(cfg.precision, "precision")
    checkpoint_io = build(cfg.checkpoint_io, "checkpoint_io")
    cluster = build(cfg.cluster, "cluster")
    strategy = build(cfg.strategy, "strategy", accelerator=accelerator, precision=precision,
                     checkpoint_io=checkpoint_io, cluster=cluster)
    fault_tolerance = build(cfg.fault_tolerance, "fault_tolerance")
    strategy.replica_share = (fault_tolerance.replica_groups, fault_tolerance.group)
    try:
        strategy.devices = fault_tolerance.resolve_devices(accelerator, cfg.get("devices", 1))
        strategy.num_nodes = int(cfg.get("num_nodes", 1))
    except (TypeError, ValueError):
        pass  # a bad `devices` value is reported by the checks that read it
    return Plugins(accelerator, precision, checkpoint_io, cluster, strategy, fault_tolerance)
