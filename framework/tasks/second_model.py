"""The protocol of a task that computes with a frozen second model beside the trained one (a
preference task's reference, a distillation's teacher), in three steps:

1. the task declares where the model comes from: `Task.frozen_source()` returns a FrozenSource (the
   key that names it in messages, its path, whether the trained model with its adapters off may
   stand for it) or None;
2. the framework builds it (framework/tasks/frozen.py: checked before launch, placed by the strategy
   in each worker, no gradients, never in the optimizer or a checkpoint) and hands it over once with
   `Task.use_frozen(Frozen)`;
3. the task computes with it as trl's trainers do with their reference: `with self.frozen.computing(
   model) as second: second(**inputs)` gives the placed frozen model, or, where the adapters stand in,
   the trained model itself with its adapters off and in eval mode (its own mode back after), always
   under no_grad.

This module holds the protocol alone (no checkpoint, tokenizer or model building), so the Task base
class depends on nothing heavier.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from framework.adapter.lora import adapters_off
from framework.errors import ConfigError

HUB_CONFIG = "config.json"


@dataclass(frozen=True)
class FrozenSource:
    """Where a task's frozen model comes from: `key` names it in messages (task.reference); `path`
    None: the trained model's initial weights, else a run, checkpoint or Hugging Face directory;
    `adapters_may_stand_in`: with an adapter, the trained model with its adapters off may be it."""

    key: str
    path: str | None = None
    adapters_may_stand_in: bool = True

    def adapters_stand_in(self, adapter) -> bool:
        """Whether the trained model with its adapters off is this model (no second one is built):
        the initial weights asked for, an adapter run, and the task allowing it."""
        return self.kind == "initial" and self.adapters_may_stand_in and bool(adapter)

    @property
    def kind(self) -> str:
        """initial, run (a run or checkpoint directory) or hub (a Hugging Face model directory)."""
        if self.path is None:
            return "initial"
        return "hub" if (Path(self.path).expanduser() / HUB_CONFIG).is_file() else "run"


@contextmanager
def evaluating(model: torch.nn.Module):
    """`model` in eval mode inside, its own mode after."""
    was = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was)


class Frozen:
    """The second model as a task computes with it: `module`, placed by the strategy, or None where
    the trained model with its adapters off stands for it; `key` names it in messages."""

    def __init__(self, key: str, module: torch.nn.Module | None = None):
        self.key, self.module = key, module

    @contextmanager
    def computing(self, trained: torch.nn.Module):
        """The module to run for the second model's outputs (no gradients): the placed one, or
        `trained` with its adapters off, in eval mode."""
        with torch.no_grad():
            if self.module is not None:
                yield self.module
                return
            with adapters_off(trained), evaluating(trained):
                yield trained


def missing(key: str, task: str) -> ConfigError:
    """What a task used outside the trainer without its second model says."""
    return ConfigError(f"task={task}: no {key.split('.')[-1]} model was placed (the trainer hands it over before the "
                       f"first step: framework/tasks/frozen.py); used outside the trainer, give it one with "
                       f"task.use_frozen(Frozen('{key}', module)) first.")
