"""Annotations a plugin uses in its signature to declare value constraints.

`batch_size: PositiveInt = 32` is read by `framework.config.targets`, which rejects
`data.batch_size=0` before anything runs, naming the key.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated


@dataclass(frozen=True)
class Bound:
    """A lower bound: value > low (strict) or value >= low."""

    low: float
    strict: bool

    def ok(self, value) -> bool:
        return value > self.low if self.strict else value >= self.low

    def describe(self) -> str:
        return f"{'>' if self.strict else '>='} {self.low:g}"


PositiveInt = Annotated[int, Bound(0, strict=True)]
NonNegativeInt = Annotated[int, Bound(0, strict=False)]
PositiveFloat = Annotated[float, Bound(0, strict=True)]
NonNegativeFloat = Annotated[float, Bound(0, strict=False)]
