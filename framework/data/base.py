"""The DataModule base class: a training, a validation and (optionally) a test dataset, plus how to load them."""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Callable

from torch.utils.data import Dataset, default_collate

from framework.config.types import NonNegativeInt, PositiveInt


class DataModule(ABC):
    """Owns a training and a validation dataset and the loader settings.

    Subclasses implement `train_dataset()` and `val_dataset()` (map-style datasets), and
    `test_dataset()` where the data has a held-out test split (`framework test`,
    `trainer.test_at_end`); the framework builds the loaders (framework.data.loaders) with a sampler from the strategy, so a
    DataModule never deals with ranks.
    """

    #: what its batches are: one of framework/data/batch_kinds.py's KINDS (None: not said; the task's
    #: step on an example batch decides before launch)
    batch_kind: str | None = None

    def __init__(self, batch_size: PositiveInt = 32, val_batch_size: PositiveInt | None = None,
                 num_workers: NonNegativeInt = 0, shuffle: bool = True, drop_last: bool = True):
        """batch_size: samples per micro-batch per process; val_batch_size: for validation
        (default: batch_size); num_workers: loader worker processes (0: load in the main process);
        shuffle: reshuffle the training set every epoch; drop_last: drop a final short batch."""
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.num_workers = num_workers
        self.shuffle = shuffle
        self.drop_last = drop_last

    def problems(self) -> list[str]:
        """Cheap checks of the data's sources before launch, without preprocessing: files that are
        missing, empty, or lack the fields the settings name (framework validate and every run read
        them, so a data mistake is refused before the run directory exists). One message per
        problem, naming the key and the fix."""
        return []

    def run_problems(self, trainer, mode: str) -> list[str]:
        """What this data cannot do with the run's loop settings (`trainer`: max_steps,
        val_batches, test_batches, ...) in `mode` (fit, test, predict), said before launch."""
        return []

    def warnings(self) -> list[str]:
        """What is allowed but likely a mistake, said before launch (a chat template's marker the
        tokenizer splits into several tokens); one message each."""
        return []

    def prepare_data(self, say: Callable[[str], None] | None = None) -> None:
        """Work to do once before the datasets are read (download-free preprocessing into a cache,
        e.g. tokenising). One process per node runs it while the others wait, then every process
        builds its datasets (from that cache). `say`: where progress lines go (the process that
        talks gets `print`; None: quiet)."""

    def test_overlap(self, trained: "DataModule") -> str | None:
        """Where this data's test split holds samples that `trained` (the data a run was trained
        with) trained on: what, said for `framework test`; None when it does not, or cannot tell."""
        return None

    def fingerprint(self) -> str | None:
        """What identifies the training data (its files, their sizes, the tokenizer, the settings
        that change the samples), after prepare_data; a checkpoint keeps it and a resume on other
        data is refused (None: not known, not checked)."""
        return None

    def collate(self):
        """The loader's collate function (None: torch's default, which stacks samples)."""
        return None

    @abstractmethod
    def train_dataset(self) -> Dataset:
        """The training split (map-style)."""

    @abstractmethod
    def val_dataset(self) -> Dataset | None:
        """The validation split (map-style); None: the data has none (data.val_percent=0), and the
        run trains without validating."""

    def validates(self) -> bool:
        """Whether the data has a validation split (said before launch, without reading it)."""
        return getattr(self, "has_val_split", True)

    def test_dataset(self) -> Dataset | None:
        """The test split (map-style), held out from training and validation; None: the data has
        none (then `has_test_split` is False and testing is refused before launch)."""
        return None

    @property
    def has_test_split(self) -> bool:
        """Whether `test_dataset()` gives a split, known without building it. The default: a
        subclass that overrides test_dataset has one; a subclass whose test split is optional
        (a setting turns it off) overrides this too."""
        return type(self).test_dataset is not DataModule.test_dataset

    def written_paths(self) -> dict[str, tuple[Path, str]]:
        """The folders this data writes (a cache of prepared data), by the config key that sets
        each, with what to do instead: checked before launch to be creatable and writable."""
        return {}

    def test_split_hint(self, trained: bool) -> str:
        """How to give this data a test split, said when testing is asked of data without one.
        `trained`: asked of a finished run (`framework test`, `predict --split test`), whose
        training data is settled: only data it never saw can test it; else a run not started yet
        (trainer.test_at_end), which can still hold a split out."""
        return "A DataModule of your own gives one by defining test_dataset()."

    def example_batch(self, size: int = 2):
        """A small training batch with the real shapes and dtypes (the contents do not matter):
        the run's preparation passes it, on the meta device, through model and task to refuse a
        model/data/task mismatch before launch. The default collates the first samples of the
        training set; a DataModule whose set is costly to build may return a synthetic batch."""
        dataset = self.train_dataset()
        return (self.collate() or default_collate)([dataset[i] for i in range(min(size, len(dataset)))])
