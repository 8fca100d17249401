"""Points from a ring of Gaussians: a synthetic 2-D data set for GANs, made from a seed (no files)."""
from __future__ import annotations

import math
from functools import cached_property

import torch
from torch.utils.data import Dataset, TensorDataset

from framework.config.types import PositiveFloat, PositiveInt
from framework.data.base import DataModule


def ring_centers(modes: int, radius: float) -> torch.Tensor:
    angles = torch.arange(modes, dtype=torch.float64) * (2 * math.pi / modes)
    return (torch.stack([angles.cos(), angles.sin()], dim=1) * radius).float()


class GaussianRing(DataModule):
    """`modes` Gaussians of standard deviation `std` evenly spaced on a circle of `radius`;
    batches are `(points,)` of shape (B, 2)."""

    #: what its batches are (framework/data/batch_kinds.py)
    batch_kind = "points"

    def __init__(self, modes: PositiveInt = 8, radius: PositiveFloat = 2.0, std: PositiveFloat = 0.05,
                 train_size: PositiveInt = 8192, val_size: PositiveInt = 1024, test_size: PositiveInt = 1024,
                 seed: int = 0, **loader):
        """modes: Gaussians on the ring; radius: of the ring; std: of each Gaussian;
        train_size / val_size / test_size: points in each split; seed: makes the points (not the
        training)."""
        super().__init__(**loader)
        self.modes, self.radius, self.std = modes, radius, std
        self.train_size, self.val_size, self.test_size, self.seed = train_size, val_size, test_size, seed

    @property
    def centers(self) -> torch.Tensor:
        return ring_centers(self.modes, self.radius)

    @cached_property
    def _splits(self):
        g = torch.Generator().manual_seed(self.seed)
        n = self.train_size + self.val_size
        which = torch.randint(0, self.modes, (n,), generator=g)
        points = self.centers[which] + self.std * torch.randn(n, 2, generator=g)
        return points[: self.train_size], points[self.train_size:]

    @cached_property
    def _test_points(self) -> torch.Tensor:
        """Drawn from a stream of their own, so the train and val points stay what they were."""
        g = torch.Generator().manual_seed(self.seed + 1)
        which = torch.randint(0, self.modes, (self.test_size,), generator=g)
        return self.centers[which] + self.std * torch.randn(self.test_size, 2, generator=g)

    def train_dataset(self) -> Dataset:
        return TensorDataset(self._splits[0])

    def val_dataset(self) -> Dataset:
        return TensorDataset(self._splits[1])

    def test_dataset(self) -> Dataset:
        return TensorDataset(self._test_points)
