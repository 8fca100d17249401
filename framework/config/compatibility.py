"""The one table of which plugin combinations are allowed.

Each rule sees a `Plan` (the built plugins plus the facts they depend on) and either refuses the
combination, naming the keys and a working alternative, or warns. Nothing else in the framework
decides compatibility; add a row here rather than an `if` elsewhere.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

from framework.errors import ConfigError


@dataclass
class Plan:
    accelerator: object
    strategy: object
    precision: object
    checkpoint_io: object
    cluster: object
    devices: int
    num_nodes: int

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes

    @property
    def names(self) -> dict:
        return {g: getattr(getattr(self, g), "name", type(getattr(self, g)).__name__)
                for g in ("accelerator", "strategy", "precision", "checkpoint_io", "cluster")}


@dataclass(frozen=True)
class Rule:
    applies: Callable[[Plan], bool]
    message: Callable[[Plan], str]
    level: str = "refuse"  # or "warn"


def _acc(p: Plan) -> str:
    return p.names["accelerator"]


RULES: list[Rule] = [
    Rule(
        lambda p: not p.accelerator.is_available(),
        lambda p: f"accelerator={_acc(p)}: {p.accelerator.unavailable_reason()} "
        "Use accelerator=cpu (or accelerator=auto to pick what this machine has).",
    ),
    Rule(
        lambda p: p.accelerator.is_available() and p.devices > p.accelerator.max_devices(),
        lambda p: f"devices={p.devices}: accelerator={_acc(p)} has only {p.accelerator.max_devices()} "
        f"device(s) on this machine; use devices={p.accelerator.max_devices()} or fewer.",
    ),
    Rule(
        lambda p: p.world_size > 1 and not p.strategy.multi_process,
        lambda p: f"strategy={p.names['strategy']} runs one process, but devices={p.devices} x "
        f"num_nodes={p.num_nodes} asks for {p.world_size}; use devices=1 num_nodes=1, or a "
        "multi-process strategy.",
    ),
    Rule(
        lambda p: _acc(p) == "mps" and p.world_size > 1,
        lambda p: "accelerator=mps supports one process only (no collective backend); use devices=1.",
    ),
    Rule(
        lambda p: _acc(p) == "mps" and p.names["precision"] == "64",
        lambda p: "precision=64 with accelerator=mps: MPS has no float64; use precision=32.",
    ),
    Rule(
        lambda p: p.names["precision"] in ("bf16", "bf16_true") and not p.accelerator.supports_bf16(),
        lambda p: f"precision={p.names['precision']}: accelerator={_acc(p)} has no bfloat16 support "
        "on this device; use precision=16 or precision=32.",
    ),
    Rule(
        lambda p: p.names["precision"] in ("16", "16_true") and not p.accelerator.fast_fp16(),
        lambda p: f"precision={p.names['precision']} on accelerator={_acc(p)}: this device has no "
        "fp16 hardware, so half precision will run many times slower than precision=32; "
        "precision=bf16 is the fast mixed precision here.",
        level="warn",
    ),
]


def check_compatibility(plan: Plan) -> None:
    """Raise one ConfigError listing every refusal; emit every warning."""
    refusals = []
    for rule in RULES:
        if rule.applies(plan):
            if rule.level == "warn":
                print(f"WARNING: {rule.message(plan)}", file=sys.stderr, flush=True)
            else:
                refusals.append(rule.message(plan))
    if refusals:
        raise ConfigError("\n".join(refusals) if len(refusals) > 1 else refusals[0])
