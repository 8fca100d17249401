"""A byte-level text corpus every machine has: the Python standard library's own source."""
from __future__ import annotations

import os
import sysconfig
import zlib
from functools import cached_property
from pathlib import Path

import torch
from torch.utils.data import Dataset

from framework.config.types import NonNegativeInt, PositiveInt
from framework.data.base import DataModule
from framework.errors import ConfigError

# Folders of the stdlib that are not ordinary library code (tests, vendored packages).
SKIPPED_DIRS = {"test", "tests", "site-packages", "dist-packages", "idlelib", "lib2to3", "__pycache__",
                "ensurepip", "turtledemo", "tkinter"}


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The stdlib's .py files in a fixed (sorted) order. Skipped folders are not entered at all
    (site-packages alone can hold more files than the stdlib)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in SKIPPED_DIRS]
        files += [Path(folder, n) for n in names if n.endswith(".py")]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


class TokenBlocks(Dataset):
    """Non-overlapping windows of `block_size + 1` tokens: (input, target shifted by one)."""

    def __init__(self, tokens: torch.Tensor, block_size: int):
        self.tokens = tokens
        self.block_size = block_size

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.block_size)

    def __getitem__(self, i: int):
        chunk = self.tokens[i * self.block_size: (i + 1) * self.block_size + 1].long()
        return chunk[:-1], chunk[1:]


class StdlibText(DataModule):
    """Bytes of the stdlib's .py files. A file goes to validation or test by crc32 of its relative
    path (the first val_percent of 100 buckets, then the next test_percent), so the split is the
    same on every run and machine with this Python, and a file is never in two splits."""

    #: what its batches are (framework/data/batch_kinds.py)
    batch_kind = "token_blocks"

    def __init__(self, block_size: PositiveInt = 128, max_bytes: PositiveInt = 2_000_000,
                 val_percent: NonNegativeInt = 10, test_percent: NonNegativeInt = 10, root: str | None = None,
                 **loader):
        """block_size: tokens per sample (the model's context); max_bytes: read at most this many
        bytes of source (every split together); val_percent: share of files held out for
        validation (0: no validation split, the run trains without validating); test_percent:
        share of files held out for testing (0: no test split); root: a folder of .py files to use
        instead of the stdlib."""
        super().__init__(**loader)
        if not 0 <= val_percent < 100:
            raise ConfigError(f"data.val_percent={val_percent}: must be between 0 (no validation split) and 99.")
        if val_percent + test_percent >= 100:
            raise ConfigError(f"data.test_percent={test_percent}: with data.val_percent={val_percent} nothing is left "
                              "to train on; keep their sum below 100.")
        self.block_size = block_size
        self.max_bytes = max_bytes
        self.val_percent = val_percent
        self.test_percent = test_percent
        self.root = Path(root) if root else Path(sysconfig.get_paths()["stdlib"])

    @property
    def has_test_split(self) -> bool:
        return self.test_percent > 0

    @property
    def has_val_split(self) -> bool:
        return self.val_percent > 0

    @cached_property
    def _splits(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        train, val, test, total = bytearray(), bytearray(), bytearray(), 0
        for path in stdlib_files(self.root):
            data = path.read_bytes()
            if total + len(data) > self.max_bytes:
                break
            total += len(data)
            bucket = zlib.crc32(path.relative_to(self.root).as_posix().encode()) % 100
            split = val if bucket < self.val_percent else test if bucket < self.val_percent + self.test_percent \
                else train
            split.extend(data)
        if not train or (self.val_percent and not val) or (self.test_percent and not test):
            found = "no file" if total == 0 else f"{total:,} bytes"
            splits = " and ".join(["a train split", *(["a val split"] * bool(self.val_percent)),
                                   *(["a test split"] * bool(self.test_percent))])
            raise ConfigError(f"data: {self.root}/**/*.py (data.root) gave {found} within data.max_bytes="
                              f"{self.max_bytes}: too little to fill {splits}; raise data.max_bytes or point "
                              "data.root at a folder with more .py files.")
        def as_tensor(data: bytearray) -> torch.Tensor:  # frombuffer refuses an empty buffer
            return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)

        return as_tensor(train), as_tensor(val), as_tensor(test)

    def train_dataset(self) -> Dataset:
        return TokenBlocks(self._splits[0], self.block_size)

    def example_batch(self, size: int = 2):
        """Token blocks of the right shape, without reading the corpus."""
        tokens = torch.zeros(size, self.block_size, dtype=torch.long)
        return tokens, tokens

    def val_dataset(self) -> Dataset | None:
        return TokenBlocks(self._splits[1], self.block_size) if self.has_val_split else None

    def test_split_hint(self, trained: bool) -> str:
        if trained:
            return ("Test a run on the files it held out: data.test_percent as the run trained with it (a run trained "
                    "with data.test_percent=0 held none out: hold a test split out when training, "
                    "data.test_percent=10, then test that run).")
        return "Give it one: data.test_percent=10 holds out a tenth of the files."

    def test_overlap(self, trained) -> str | None:
        if not isinstance(trained, StdlibText) or self.test_percent == 0:
            return None
        low = max(self.val_percent, trained.val_percent + trained.test_percent)
        high = self.val_percent + self.test_percent
        if low >= high:
            return None
        return (f"data.test_percent={self.test_percent} holds out files the run trained on (it held out "
                f"data.val_percent={trained.val_percent} and data.test_percent={trained.test_percent}: {high - low}% of "
                "the files trained)")

    def test_dataset(self) -> Dataset | None:
        return TokenBlocks(self._splits[2], self.block_size) if self.has_test_split else None
