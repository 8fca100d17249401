"""8x8 handwritten digits (1,797 images) that ship inside scikit-learn: no download."""
from __future__ import annotations

import gzip
import importlib.util
from functools import cache, cached_property
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from framework.config.types import PositiveInt
from framework.data.base import DataModule
from framework.errors import ConfigError


class Digits(DataModule):
    """Features scaled to [0, 1] (64 per image), labels 0-9. Images are held out by index, a fixed
    split the same on every machine: those whose index is a multiple of `val_every_nth` for
    validation, and of the rest those one past a multiple of `test_every_nth` for testing."""

    #: what its batches are (framework/data/batch_kinds.py)
    batch_kind = "features"

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

    def test_split_hint(self, trained: bool) -> str:
        if trained:
            return ("Test a run on the images it held out: data.test_every_nth as the run trained with it (a run "
                    "trained with data.test_every_nth=null held none out: hold a test split out when training, "
                    "data.test_every_nth=5, then test that run).")
        return "Give it one: data.test_every_nth=5 holds out a fifth of the images that do not validate."

    def test_overlap(self, trained) -> str | None:
        if not isinstance(trained, Digits) or not self.has_test_split:
            return None
        index = torch.arange(len(self._labels()))
        tested = self._roles(index)[2]
        shared = int((tested & trained._roles(index)[0]).sum())
        return (f"data.test_every_nth={self.test_every_nth} tests {shared} image(s) the run trained on (it held out "
                f"data.val_every_nth={trained.val_every_nth}, data.test_every_nth={trained.test_every_nth})"
                if shared else None)

    def _roles(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(train, val, test) masks over the images' indices: the split rule, written once."""
        is_val = index % self.val_every_nth == 0
        is_test = ~is_val & (index % self.test_every_nth == 1) if self.test_every_nth else torch.zeros_like(is_val)
        return ~is_val & ~is_test, is_val, is_test

    @staticmethod
    def _labels():
        return bundled_digits()[1]

    @cached_property
    def _tensors(self):
        x, y = bundled_digits()
        is_train, is_val, is_test = self._roles(torch.arange(len(y), device="cpu"))
        return (x[is_train], y[is_train]), (x[is_val], y[is_val]), (x[is_test], y[is_test])

    def train_dataset(self) -> Dataset:
        return TensorDataset(*self._tensors[0])

    def val_dataset(self) -> Dataset:
        return TensorDataset(*self._tensors[1])

    def test_dataset(self) -> Dataset | None:
        return TensorDataset(*self._tensors[2]) if self.has_test_split else None


@cache
def bundled_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """(features scaled to [0, 1], labels) of all 1,797 images, read once per process (a run's
    preflight, its loaders and `framework list` build the data module again and again). Indexing
    them copies, so no caller can change them."""
    # scikit-learn's own file, read as its load_digits reads it (np.loadtxt of the gzipped csv:
    # 64 pixel values 0-16, then the label) without importing scikit-learn, which costs a second
    # in every process that builds the data (each worker and the preflight)
    found = importlib.util.find_spec("sklearn")  # finds the package without running it
    path = Path(found.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz" if found else None
    if path is None or not path.is_file():
        raise ConfigError("data=digits: reads the digits bundled with scikit-learn (sklearn/datasets/data/digits.csv.gz), "
                          "which is not installed here; pip install scikit-learn.")
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",")
    # on the CPU whatever device a caller's context sets (preflight's is meta)
    return (torch.tensor(table[:, :-1], dtype=torch.float32, device="cpu") / 16.0,
            torch.tensor(table[:, -1].astype(np.int64), dtype=torch.long, device="cpu"))
