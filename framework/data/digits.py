"""8x8 handwritten digits (1,797 images) that ship inside scikit-learn: no download."""
from __future__ import annotations

from functools import cached_property

import torch
from torch.utils.data import Dataset, TensorDataset

from framework.config.types import PositiveInt
from framework.data.base import DataModule


class Digits(DataModule):
    """Features scaled to [0, 1] (64 per image), labels 0-9. Every `val_every_nth` image (by
    index) is held out for validation: a fixed, class-balanced split."""

    def __init__(self, val_every_nth: PositiveInt = 5, **loader):
        """val_every_nth: hold out images whose index is a multiple of this (5: 20%)."""
        super().__init__(**loader)
        self.val_every_nth = val_every_nth

    @cached_property
    def _tensors(self):
        from sklearn.datasets import load_digits  # bundled with scikit-learn, read from its package

        bunch = load_digits()
        x = torch.tensor(bunch.data, dtype=torch.float32) / 16.0
        y = torch.tensor(bunch.target, dtype=torch.long)
        is_val = torch.arange(len(y)) % self.val_every_nth == 0
        return (x[~is_val], y[~is_val]), (x[is_val], y[is_val])

    def train_dataset(self) -> Dataset:
        return TensorDataset(*self._tensors[0])

    def val_dataset(self) -> Dataset:
        return TensorDataset(*self._tensors[1])
