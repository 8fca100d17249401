"""`trainer.compile=true`: torch.compile each unit (framework/construction/units.py: the
transformer blocks the sharding strategies gather and activation checkpointing recomputes), or the
whole model where it has none. Compiled in place (`Module.compile`), so module and parameter
names, and so checkpoints, are unchanged; a sharding wrapper's hooks stay outside each compiled
block, as torchtitan compiles its blocks before sharding them.

Compilation happens at the first forward (and again for a new input shape); the time that first
forward took is said once, so a slow first step is not mistaken for a slow run.
"""
from __future__ import annotations

import time
from typing import Callable

import torch
from torch import nn

from framework.construction.units import Units


def compile_units(model: nn.Module, units: Callable[[nn.Module], Units], talk: bool) -> str:
    """Compile every unit of `model` (or the model itself when it has none) in place; returns what
    was compiled, as the user reads it."""
    chosen = units(model)
    targets = chosen.modules or [model]
    for module in targets:
        module.compile()
    what = chosen.listed() if chosen.modules else f"the whole {type(model).__name__} (it has no units)"
    if talk:
        print(f"compile: torch.compile on {what}; compiled at the first forward", flush=True)
        _say_first_forward(model, what)
    return what


def _say_first_forward(model: nn.Module, what: str) -> None:
    """Print how long the first forward took (compilation included), once."""
    started: list[float] = []

    @torch.compiler.disable  # a model compiled whole would otherwise trace its own timer
    def before(module, args):
        started.append(time.perf_counter())

    @torch.compiler.disable
    def after(module, args, output):
        seconds = time.perf_counter() - started[0]
        print(f"compile: the first forward took {seconds:.1f} s, compiling {what} included (the first backward "
              "compiles too)", flush=True)
        pre.remove()
        post.remove()

    pre = model.register_forward_pre_hook(before)
    post = model.register_forward_hook(after)
