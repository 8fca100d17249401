"""The data's splits and the roles of a run's files, defined once, and the one rule that sends a
document of data.files to a split.

A document of data.files goes to a split by a hash of its own content (never its row number), in
100 buckets: the first val_percent validate, the next test_percent test, the rest train; a split
given files of its own (data.val_files, data.test_files) takes none by hash. The store
(framework/data/prepare.py), the stream (stream.py) and the overlap check of `framework test`
(text_files.py) all ask this rule, so a growing corpus never moves validation into training and
the split is the same at every world size.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

SPLITS = ("train", "val", "test")
SPLIT_NAMES = {"train": "training", "val": "validation", "test": "test"}  # as a message says them
# The config keys that list a run's files, and the split all of a role's files go to (None: each
# document by the hash rule).
FILE_ROLES = {"files": None, "val_files": "val", "test_files": "test"}
BUCKETS = 100


@dataclass(frozen=True)
class SplitRule:
    val_percent: int = 0
    test_percent: int = 0
    val_files: bool = False  # data.val_files given: validation takes no document of data.files
    test_files: bool = False  # data.test_files given: testing takes none either

    @property
    def val_cut(self) -> int:
        return 0 if self.val_files else self.val_percent

    @property
    def test_cut(self) -> int:
        return self.val_cut + (0 if self.test_files else self.test_percent)

    def split_of(self, key: bytes) -> tuple[str, int]:
        """(the split of the document whose content is `key`, its digest)."""
        digest = zlib.crc32(key)
        bucket = digest % BUCKETS
        return ("val" if bucket < self.val_cut else "test" if bucket < self.test_cut else "train"), digest

    def first_training_bucket(self) -> int:
        """The buckets of data.files' documents that train: this one to the last."""
        return self.test_cut

    def held_out(self, split: str) -> tuple[int, int]:
        """The buckets [low, high) of data.files' documents that `split` (val or test) takes."""
        return (0, self.val_cut) if split == "val" else (self.val_cut, self.test_cut)

    def may_hold(self, role: str | None, split: str) -> bool:
        """Whether files of `role` (None: data.files, split by hash) may hold documents of `split`:
        the held-out splits read data.files only where they have no files of their own."""
        if role is not None:
            return role == split
        if split == "train":
            return True
        low, high = self.held_out(split)
        return high > low
