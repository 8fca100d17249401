"""Manual optimization: a task that steps several optimizers itself (a GAN's generator and
discriminator), through the strategy, so precision, clipping and gradient sync still apply.

The framework sees one `OptimizerSet`: a torch Optimizer whose parameter groups and state are
those of the named optimizers inside it, in order. Checkpoints (full or sharded, any strategy
that supports manual optimization), LR schedulers and resume treat it like any optimizer; the
task reaches the named ones through `ManualOptimization`.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterable

import torch

from framework.errors import ConfigError


class OptimizerSet(torch.optim.Optimizer):
    """Named optimizers presented as one. `step()` steps them all (used only by state
    initialisation); a manual task steps them one at a time through `ManualOptimization.step`."""

    def __init__(self, optimizers: dict[str, torch.optim.Optimizer]):
        if not optimizers:
            raise ValueError("an OptimizerSet needs at least one optimizer")
        self.optimizers = dict(optimizers)
        params = [p for opt in self.optimizers.values() for g in opt.param_groups for p in g["params"]]
        super().__init__(params, defaults={})
        # the members' own group dicts: an LR scheduler on the set changes the members' rates
        self.param_groups = [g for opt in self.optimizers.values() for g in opt.param_groups]

    @property
    def state(self):
        merged = {}
        for opt in getattr(self, "optimizers", {}).values():
            merged.update(opt.state)
        return merged

    @state.setter
    def state(self, value) -> None:  # torch.optim.Optimizer.__init__ assigns an empty one
        pass

    def step(self, closure: Callable | None = None):
        self._opt_called = True  # what an LR scheduler checks
        for opt in self.optimizers.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        """torch's format over all members' groups in order (what DCP and resume expect)."""
        states, groups, index = {}, [], 0
        for opt in self.optimizers.values():
            member = opt.state_dict()
            mapping = {}
            for group in member["param_groups"]:
                ids = []
                for old in group["params"]:
                    mapping[old] = index
                    ids.append(index)
                    index += 1
                groups.append({**group, "params": ids})
            states.update({mapping[old]: value for old, value in member["state"].items()})
        return {"state": states, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        groups = list(state_dict["param_groups"])
        for opt in self.optimizers.values():
            own, groups = groups[: len(opt.param_groups)], groups[len(opt.param_groups):]
            renumber = {old: new for new, old in enumerate(i for g in own for i in g["params"])}
            opt.load_state_dict({
                "state": {renumber[i]: v for i, v in state_dict["state"].items() if i in renumber},
                "param_groups": [{**g, "params": [renumber[i] for i in g["params"]]} for g in own],
            })
        if groups:
            raise ValueError(f"the checkpoint has {len(groups)} more parameter group(s) than this OptimizerSet")

    def __repr__(self) -> str:
        return f"OptimizerSet({', '.join(f'{k}={type(v).__name__}' for k, v in self.optimizers.items())})"


def optimizer_set_factory(task, model: torch.nn.Module, optimizer_factory) -> Callable:
    """What a manual task's strategy calls instead of the optimizer factory: one optimizer per
    named group of `task.optimizer_groups(model)`. `model` is the module the strategy wraps (DDP
    keeps its parameters, FSDP2 shards them in place), so the groups are read after wrapping."""

    def build(_all_parameters: Iterable) -> OptimizerSet:
        groups = {name: list(params) for name, params in task.optimizer_groups(model).items()}
        seen: dict[int, str] = {}
        for name, params in groups.items():
            for p in params:
                if id(p) in seen:
                    raise ConfigError(f"task: a parameter is in both optimizer groups {seen[id(p)]!r} and {name!r}; "
                                      "each parameter belongs to one optimizer.")
                seen[id(p)] = name
        left_out = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in seen]
        if left_out:
            raise ConfigError(f"task: parameters in no optimizer group: {', '.join(left_out[:5])}; "
                              "optimizer_groups must cover every trainable parameter.")
        return OptimizerSet({name: optimizer_factory(params) for name, params in groups.items()})

    return build


class ManualOptimization:
    """What a manual task's `training_step(model, batch, optimization)` uses:
    `optimization.toggle(name)` (only that optimizer's parameters require grad inside),
    `optimization.backward(loss)`, `optimization.step(name)` (clip, step, zero its gradients),
    and `optimization.optimizers[name]` for anything else."""

    def __init__(self, strategy, model: torch.nn.Module, optimizer_set: OptimizerSet,
                 clip_grad_norm: float | None, clip_grad_value: float | None):
        self.strategy = strategy
        self.model = model
        self.optimizer_set = optimizer_set
        self.optimizers = optimizer_set.optimizers
        self.clip_grad_norm = clip_grad_norm
        self.clip_grad_value = clip_grad_value
        self.grad_norms: dict[str, float] = {}
        self.skipped: list[str] = []

    @contextmanager
    def toggle(self, name: str):
        """Inside, only `name`'s parameters require grad: another optimizer's parameters get no
        gradient from this loss (and DDP leaves them out of the reduction)."""
        own = {id(p) for g in self.optimizers[name].param_groups for p in g["params"]}
        frozen = [p for p in self.model.parameters() if p.requires_grad and id(p) not in own]
        for p in frozen:
            p.requires_grad_(False)
        try:
            yield
        finally:
            for p in frozen:
                p.requires_grad_(True)

    def backward(self, loss: torch.Tensor) -> None:
        self.strategy.backward(loss)

    def step(self, name: str) -> bool:
        optimizer = self.optimizers[name]
        params = [p for g in optimizer.param_groups for p in g["params"]]
        norm = self.strategy.clip_gradients(self.model, optimizer, self.clip_grad_norm, self.clip_grad_value, params)
        if norm is not None:
            self.grad_norms[name] = float(norm)
        stepped = self.strategy.optimizer_step(optimizer)
        self.optimizer_set._opt_called = True  # an LR scheduler on the set sees that a step happened
        if not stepped:
            self.skipped.append(name)
        self.strategy.zero_grad(optimizer)
        return stepped
