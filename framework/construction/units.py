"""Which modules a sharding strategy treats as units (gathered together, freed after use), and
the one rule that picks them, shared by the run, `framework plan` and `framework validate`:

1. `strategy.wrap_modules`: class names the user gave (`[]`: the root alone, on purpose);
2. else the model's own `sharding_units` (class names; GPT: its Blocks);
3. else a Hugging Face model's `_no_split_modules`;
4. else a size rule: bottom-up, every module whose parameters not already in a unit below it
   reach `min_unit_params` becomes a unit (torch's size-based wrapping policy).

The root always holds what no unit took. Activation checkpointing uses the same units.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from framework.errors import ConfigError, did_you_mean

DEFAULT_MIN_UNIT_PARAMS = 1_000_000


@dataclass
class Units:
    modules: list[nn.Module]  # the units, in module order (never the root)
    rule: str  # where they came from, as the user reads it
    gathered: list[int]  # parameters gathered at once by each unit (nested units excluded), then the root's

    @property
    def largest(self) -> int:
        """The most parameters any one unit (or the root's remainder) gathers at once."""
        return max(self.gathered, default=0)

    def listed(self) -> str:
        """'12 x Block (the model's sharding_units)'."""
        counts: dict[str, int] = {}
        for module in self.modules:
            counts[type(module).__name__] = counts.get(type(module).__name__, 0) + 1
        listed = ", ".join(f"{n} x {name}" for name, n in counts.items()) or "no unit: the root alone"
        return f"{listed} ({self.rule})"

    def describe(self) -> str:
        """'12 x Block (the model's sharding_units); the root holds 38.6M parameters'."""
        return f"{self.listed()}; the root holds {_millions(self.gathered[-1])} parameters"


def numel(p) -> int:
    """A parameter's full size, also under ZeRO-3 (whose partitioned parameters hold no data)."""
    return getattr(p, "ds_numel", None) or p.numel()


def _millions(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 100_000 else f"{n:,}"


def _class_names(model: nn.Module) -> list[str]:
    return sorted({type(m).__name__ for m in model.modules()})


def choose_units(model: nn.Module, wrap_modules: list[str] | None = None,
                 min_unit_params: int = DEFAULT_MIN_UNIT_PARAMS) -> Units:
    """The units of `model` by the rule above (works on a model built on the meta device)."""
    if wrap_modules is not None:
        names, rule = list(wrap_modules), "strategy.wrap_modules"
        missing = [n for n in names if n not in _class_names(model)]
        if missing:
            hint = did_you_mean(missing[0], _class_names(model))
            raise ConfigError(f"strategy.wrap_modules={names}: the model has no module of class "
                              f"{', '.join(missing)}.{hint} Its classes: {', '.join(_class_names(model))}; or "
                              "strategy.wrap_modules=null to let the framework choose.")
        return _by_class(model, names, rule)
    own = getattr(model, "sharding_units", None)
    if own:
        return _by_class(model, list(own), "the model's sharding_units")
    no_split = getattr(model, "_no_split_modules", None)
    if no_split:
        return _by_class(model, list(no_split), "the model's _no_split_modules")
    return _by_size(model, min_unit_params)


def _by_class(model: nn.Module, names: list[str], rule: str) -> Units:
    chosen = {id(m) for m in model.modules() if type(m).__name__ in names and m is not model}
    return _gathered(model, [m for m in model.modules() if id(m) in chosen], rule)


def _by_size(model: nn.Module, min_params: int) -> Units:
    chosen: set[int] = set()

    def remaining(module: nn.Module) -> int:  # parameters not yet in a unit, bottom-up
        count = sum(numel(p) for p in module.parameters(recurse=False))
        count += sum(remaining(child) for child in module.children())
        if module is not model and count >= min_params:
            chosen.add(id(module))
            return 0
        return count

    remaining(model)
    rule = f"size rule: modules of at least {min_params:,} parameters (strategy.min_unit_params)"
    return _gathered(model, [m for m in model.modules() if id(m) in chosen], rule)


def _gathered(model: nn.Module, units: list[nn.Module], rule: str) -> Units:
    """Parameters each unit gathers (its own, less nested units'), and the root's remainder."""
    unit_ids = {id(u) for u in units}
    seen: set[int] = set()  # a tied parameter is gathered once, by the first module that holds it

    def own(module: nn.Module) -> int:
        count = 0
        for p in module.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                count += numel(p)
        for child in module.children():
            if id(child) not in unit_ids:
                count += own(child)
        return count

    gathered = [own(u) for u in units]
    return Units(units, rule, gathered + [own(model)])
