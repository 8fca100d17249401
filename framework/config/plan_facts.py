"""What the compatibility table (framework/config/compatibility.py) judges: a `Plan`, the built
plugins with the facts their rules depend on, and the small readings of it the rules share (names
as the user wrote them, capability flags, what is installed)."""
from __future__ import annotations

import ctypes.util
import importlib.util
from dataclasses import dataclass, field

import torch

from framework.config.groups import PLUGIN_GROUPS
from framework.config.loop_settings import LoopSettings


def processes_per_node(strategy, devices: int) -> int:
    """Processes a node runs for `devices` devices: one each, or one for all (a strategy whose
    `spmd` flag says one process drives all of a node's devices)."""
    return 1 if getattr(strategy, "spmd", False) else devices


@dataclass
class Plan:
    accelerator: object
    strategy: object
    precision: object
    checkpoint_io: object
    cluster: object
    devices: int
    num_nodes: int
    loop: LoopSettings = field(default_factory=LoopSettings)
    fault_tolerance: object = None  # the option's object (framework/fault_tolerance); None: none
    mode: str = "fit"  # what the run does: fit, test (framework test) or predict (framework predict)

    @property
    def world_size(self) -> int:
        """Processes in the whole job (one per device, or one per node under SPMD)."""
        return processes_per_node(self.strategy, self.devices) * self.num_nodes

    @property
    def names(self) -> dict:
        return {g: getattr(getattr(self, g), "name", type(getattr(self, g)).__name__)
                for g in PLUGIN_GROUPS}


def _expert_size(p: Plan) -> int:
    """The ranks that spread a mixture of experts' experts (strategy.expert_parallel_size; 1 without)."""
    return int(getattr(getattr(p.strategy, "dims_settings", None), "expert", 1) or 1)


def _context_size(p: Plan) -> int:
    """The ranks that split every sequence (strategy.context_parallel_size; 1 without)."""
    return int(getattr(getattr(p.strategy, "dims_settings", None), "context", 1) or 1)


def _context_pipeline(p: Plan) -> str:
    """The stages the layout resolves to under context parallelism, for the message."""
    try:
        return str(p.strategy.parallel_dims(p.world_size).pipeline)
    except Exception:  # sizes the strategy itself refuses: its own message says why
        return "?"


def _groups(p: Plan) -> bool:
    """Whether the fault_tolerance option runs replica groups."""
    return bool(getattr(p.fault_tolerance, "forms_groups", False))


def _shared_gpus(p: Plan) -> int | None:
    """The GPUs this machine has where the replica groups one command starts would share them
    (fewer than replica_groups x devices: framework/launch/replica_groups.py wraps around); else None."""
    ft, acc = p.fault_tolerance, p.accelerator
    if not getattr(ft, "launches_groups", False) or acc.visible_devices_env is None or not acc.is_available():
        return None
    return acc.max_devices() if ft.replica_groups * p.devices > acc.max_devices() else None


def _acc(p: Plan) -> str:
    return p.names["accelerator"]


def _prec(p: Plan) -> str:
    return p.names["precision"]


def _strat(p: Plan) -> str:
    return p.names["strategy"]


def _flag(p: Plan, name: str, default):
    """A setting only some strategies have (DeepSpeed's stage and offload devices, ddp's kwargs);
    capability flags are declared on the Strategy class and read as attributes."""
    return getattr(p.strategy, name, default)


def _max_processes(p: Plan) -> int:
    accelerator = p.accelerator
    return accelerator.max_processes() if hasattr(accelerator, "max_processes") else accelerator.max_devices()


def _missing_package(p: Plan) -> str | None:
    """The Python package the precision needs (quantized precisions: bitsandbytes), if missing."""
    package = getattr(p.precision, "python_package", None)
    return package if package and importlib.util.find_spec(package) is None else None


def _xla_accelerator(p: Plan) -> bool:
    return _acc(p) in ("xla", "tpu")


def _xla_only_plugins(p: Plan) -> list[str]:
    """The checkpoint_io and cluster choices that serve XLA runs only (their class's `xla` flag)."""
    return [f"{group}={p.names[group]}" for group in ("checkpoint_io", "cluster")
            if getattr(getattr(p, group), "xla", False)]


def _quantized(p: Plan) -> bool:
    return getattr(p.precision, "python_package", None) == "bitsandbytes"


def torch_version() -> tuple[int, int]:
    """(major, minor) of the installed torch."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def _too_old(p: Plan) -> list[tuple[str, str, str]]:
    """(group, option, the torch it needs) for each chosen plugin whose `requires_torch` (a class
    flag, "major.minor") is newer than the installed torch."""
    found = []
    for group in ("strategy", "precision"):
        needed = getattr(getattr(p, group), "requires_torch", None)
        if needed and torch_version() < tuple(int(x) for x in needed.split(".")):
            found.append((group, p.names[group], needed))
    return found


def _missing_libraries(p: Plan) -> list[str]:
    return [lib for lib in p.strategy.abilities.native_libraries if ctypes.util.find_library(lib) is None]
