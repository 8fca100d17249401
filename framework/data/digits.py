"""8x8 handwritten digits (1,797 images) that ship inside scikit-learn: no download."""
from __future__ import annotations

from functools import cached_property

import torch
from torch.utils.data import Dataset, TensorDataset

from framework.config.types import PositiveInt
from framework.data.base import DataModule


class Digits(DataModule):
    """Features scaled to [0, 1] (64 per image), labels 0-9. Images are held out by index, a fixed
    split the same on every machine: those whose index is a multiple of `val_every_nth` for
    validation, and of the rest those one past a multiple of `test_every_nth` for testing."""

    def __init__(self, val_every_nth: PositiveInt = 5, test_every_nth: PositiveInt | None = 5, **loader):
        """val_every_nth: hold out images whose index is a multiple of this for validation (5:
        20%); test_every_nth: hold out, of the others, those whose index is one more than a
        multiple of this for testing (5: 20%; null: no test split, all of them train)."""
        super().__init__(**loader)
        self.val_every_nth = val_every_nth
        self.test_every_nth = test_every_nth

    @property
    def has_test_split(self) -> bool:
        return self.test_every_nth is not None

    @cached_property
    def _tensors(self):
        from sklearn.datasets import load_digits  # bundled with scikit-learn, read from its package

        bunch = load_digits()
        x = torch.tensor(bunch.data, dtype=torch.float32) / 16.0
        y = torch.tensor(bunch.target, dtype=torch.long)
        index = torch.arange(len(y))
        is_val = index % self.val_every_nth == 0
        is_test = ~is_val & (index % self.test_every_nth == 1) if self.test_every_nth else torch.zeros_like(is_val)
        is_train = ~is_val & ~is_test
        return (x[is_train], y[is_train]), (x[is_val], y[is_val]), (x[is_test], y[is_test])

    def train_dataset(self) -> Dataset:
        return TensorDataset(*self._tensors[0])

    def val_dataset(self) -> Dataset:
        return TensorDataset(*self._tensors[1])

    def test_dataset(self) -> Dataset | None:
        return TensorDataset(*self._tensors[2]) if self.has_test_split else None
