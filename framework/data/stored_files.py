"""Files read through a prepared store: what text files and chat files share. The run's files in
their roles (data.files, val_files, test_files; globs and folders), a tokenizer, the store they are
tokenised into once (framework/data/prepare.py) and memory-mapped by every rank, the splits by the
one hash rule (framework/data/splits.py), the store's fingerprint kept in checkpoints, the cache
folder checked before launch, and what `framework test` asks of data (a test split, and none of
the training data in it). A subclass says how a row becomes tokens (`encoder`), which settings
change them (`settings`), and how a split is served (`_dataset`).

data=text_files (framework/data/text_files.py) and data=chat_files (chat_files.py) are the two.
"""
from __future__ import annotations

import itertools
import os
from abc import abstractmethod
from collections.abc import Callable
from functools import cached_property
from pathlib import Path

import torch
from torch.utils.data import Dataset

from framework.config.resolvers import BYTES
from framework.config.types import NonNegativeInt, PositiveInt
from framework.data.base import DataModule
from framework.data.prepare import CACHE_VARIABLE, StoreSpec, default_cache_root, file_sha256, prepare
from framework.data.sources import RowError, expand, file_format, read_rows
from framework.data.splits import FILE_ROLES, SPLIT_NAMES, SplitRule
from framework.data.store import open_split, read_manifest, shared_documents
from framework.data.tokenizer import Tokenizer, loaded_tokenizer
from framework.errors import ConfigError

TOKEN_DTYPES = ("auto", "uint8", "uint16", "uint32")


def store_dtype(tokenizer: Tokenizer, given: str) -> str:
    """The store's integer type: the smallest that holds every id (bytes: uint8; vocabularies up to
    65,536: uint16; else uint32), or the one given, if it holds them."""
    if given not in TOKEN_DTYPES:
        raise ConfigError(f"data.token_dtype={given!r}: choose one of {', '.join(TOKEN_DTYPES)}.")
    fitting = [name for name, ids in (("uint8", 1 << 8), ("uint16", 1 << 16), ("uint32", 1 << 32))
               if tokenizer.vocab_size <= ids]
    if given != "auto" and given not in fitting:
        raise ConfigError(f"data.token_dtype={given}: the tokenizer has {tokenizer.vocab_size:,} tokens, more ids than "
                          f"{given} holds; use data.token_dtype={fitting[0]} or auto.")
    return fitting[0] if given == "auto" else given


def named(files: list[str], most: int = 3) -> str:
    return ", ".join(files[:most]) + (f" and {len(files) - most} more" if len(files) > most else "")


def first_rows(path: str, fmt: str, count: int = 1, text_unit: str = "document") -> list | str:
    """A file's first `count` rows (a string saying what is wrong when they do not read)."""
    try:
        rows = [row for _, row in itertools.islice(read_rows(path, fmt, text_unit=text_unit), count)]
    except (RowError, OSError) as err:
        return str(err).removeprefix(path).lstrip(",: ").rstrip(".")
    if not rows:
        return "holds only blank lines" if fmt == "jsonl" else "has no row"
    return rows


class PadCollate:
    """Pads a batch of rows to its longest: input_ids (pad_id), attention_mask, labels (-100 on
    padding; a row's own labels where it has them, else its input_ids)."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, rows):
        length = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), length), self.pad_id, dtype=torch.long)
        labels = torch.full((len(rows), length), -100, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, row in enumerate(rows):
            n = len(row["input_ids"])
            ids[i, :n], labels[i, :n], mask[i, :n] = row["input_ids"], row.get("labels", row["input_ids"]), 1
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class StoredFiles(DataModule):
    """Local files, tokenised once into a store, served from it."""

    kind = "text"  # the store's kind: text, or chat (its documents carry which tokens are scored)
    streaming = False  # data=text_files may read its files while training instead (framework/data/stream.py)
    text_unit = "document"  # what one document of a plain-text file is (data=text_files sets it)
    separator: str | None = None
    #: what a row must hold where plain text cannot be one (chat data, pairs): data.format=text is refused saying it
    row_fields: str | None = None

    def __init__(self, files: str | list[str], val_files: str | list[str] | None = None, val_percent: NonNegativeInt = 5,
                 test_files: str | list[str] | None = None, test_percent: NonNegativeInt = 0,
                 format: str | None = None, tokenizer: str = BYTES, block_size: PositiveInt = 128,
                 packing: bool = True, cache_dir: str | None = None, num_proc: PositiveInt | None = None,
                 token_dtype: str = "auto", allow_changed: bool = False, **loader):
        """The settings every stored kind shares (data=text_files documents each)."""
        super().__init__(**loader)
        if not 0 <= val_percent < 100:
            raise ConfigError(f"data.val_percent={val_percent}: must be between 0 (no validation split) and 99.")
        if not test_files and val_percent + test_percent >= 100:
            raise ConfigError(f"data.test_percent={test_percent}: with data.val_percent={val_percent} no row is left to "
                              "train on; keep their sum below 100, or give data.test_files.")
        given = {"files": files, "val_files": val_files, "test_files": test_files}
        self.patterns = {key: [os.path.abspath(os.path.expanduser(str(p))) for p in ([v] if isinstance(v, str) else v)]
                         for key, v in given.items() if v}
        found = {role: expand(given[role], f"data.{role}") if given[role] else None for role in FILE_ROLES}
        self.files, self.val_files, self.test_files = found["files"], found["val_files"], found["test_files"]
        self.val_percent = val_percent
        self.test_percent = 0 if self.test_files else test_percent
        self.format = file_format(self.files + (self.val_files or []) + (self.test_files or []), format, "data.files")
        if self.format == "text" and self.row_fields:
            raise ConfigError(f"data.format=text: {self.row_fields}")
        self.tokenizer = loaded_tokenizer(str(tokenizer))
        self.block_size = block_size
        self.packing = packing
        self.cache_dir = os.path.abspath(os.path.expanduser(cache_dir)) if cache_dir else None
        self.num_proc = num_proc
        self.token_dtype = store_dtype(self.tokenizer, token_dtype)
        self.allow_changed = allow_changed
        self._opened: tuple | None = None  # the splits, once opened (splits())

    # ---- what a kind of stored files says ---------------------------------------------------
    @abstractmethod
    def encoder(self):
        """A batch of a file's rows to Encoded documents (pickled to the preparing processes)."""

    @abstractmethod
    def settings(self) -> dict:
        """Every setting that changes the tokens (the store's identity besides files and tokenizer)."""

    @abstractmethod
    def missing_message(self) -> str:
        """What to say of rows without what the encoder reads ({count}, {where} filled in)."""

    @abstractmethod
    def _dataset(self, split: str) -> Dataset:
        """One split served from the store (or the stream)."""

    def roles(self) -> dict[str, list[str]]:
        """Each file role (framework/data/splits.py FILE_ROLES) and its files."""
        return {role: getattr(self, role) or [] for role in FILE_ROLES}

    def store_spec(self) -> StoreSpec:
        return StoreSpec(kind=self.kind, roles=self.roles(),
                         patterns=self.patterns, tokenizer=self._tokenizer_identity(),
                         format=self.format, settings=self.settings(), tokenizer_sha256=self.tokenizer.sha256(),
                         dtype=self.token_dtype, encoder=self.encoder(),
                         cache_root=Path(self.cache_dir) if self.cache_dir else default_cache_root(),
                         num_proc=self.num_proc, text_unit=self.text_unit,
                         separator=self.separator, val_percent=self.val_percent, test_percent=self.test_percent,
                         missing=self.missing_message())

    @cached_property
    def _stream_spec(self) -> StoreSpec:
        """The spec a stream reads by (its splits and fingerprint share one: the tokenizer hashed once)."""
        return self.store_spec()

    def _tokenizer_identity(self) -> str:
        """The tokenizer's path as the store's key holds it: absolute (`./tok` from the folder a run is
        in, and the absolute path its recorded config holds, are one store), or a name as given."""
        spec = str(self.tokenizer.spec)
        path = os.path.expanduser(spec)
        return os.path.abspath(path) if os.path.exists(path) else spec

    def prepare_data(self, say: Callable[[str], None] | None = None) -> None:
        """Tokenise into the store once (reused while nothing that changes it changed), and open its
        splits (a split too small for one sample is refused here). Streamed data prepares nothing."""
        if self.streaming:
            return
        self._store = prepare(self.store_spec(), lambda line: say(line) if say else None)
        self.splits()

    @cached_property
    def _store(self) -> Path:
        return prepare(self.store_spec(), lambda line: None)

    @property
    def split_rule(self) -> SplitRule:
        return SplitRule(self.val_percent, self.test_percent, bool(self.val_files), bool(self.test_files))

    def test_overlap(self, trained: StoredFiles) -> str | None:
        if not isinstance(trained, StoredFiles):
            return None
        trained_files = set(trained.files)
        if self.test_files:
            shared = sorted(set(self.test_files) & trained_files)
            if shared:
                return f"data.test_files holds files the run trained on ({named(shared)}: data.files then)"
            return self._trained_contents(trained)
        shared = sorted(set(self.files) & trained_files)
        tested = self.split_rule.held_out("test")
        low, high = max(tested[0], trained.split_rule.first_training_bucket()), tested[1]
        if not shared or low >= high:
            return None
        return (f"data.test_percent={self.test_percent} holds out documents of {named(shared)} that the run trained on "
                f"(it held out data.val_percent={trained.val_percent} and data.test_percent={trained.test_percent}: "
                f"{high - low}% of these documents trained)")

    def _trained_contents(self, trained: StoredFiles) -> str | None:
        """data.test_files that hold what the run trained on under other names: a copy of a training
        file (the same bytes), or documents with the same tokens as training documents (rows copied
        out of data.files), compared through the prepared stores."""
        trained_hashes = {file_sha256(path): path for path in trained.files}
        copies = sorted(f"{path} = {trained_hashes[digest]}" for path, digest in
                        ((path, file_sha256(path)) for path in self.test_files) if digest in trained_hashes)
        if copies:
            return f"data.test_files holds copies of files the run trained on ({named(copies)})"
        if self.streaming or trained.streaming:
            return None  # a stream keeps no store to compare documents in
        tested, trained_split = open_split(self._store, "test"), open_split(trained._store, "train")
        if tested is None or trained_split is None or not tested.documents:
            return None
        shared = shared_documents(tested, trained_split)
        return (f"data.test_files holds {shared} of its {tested.documents} document(s) with the tokens of documents the "
                f"run trained on (rows copied from {named(sorted(trained.files))})" if shared else None)

    def written_paths(self) -> dict[str, tuple[Path, str]]:
        """The store's cache folder (a stream writes its unit counts there too)."""
        key = "data.cache_dir" if self.cache_dir else f"data.cache_dir (null: ${CACHE_VARIABLE} or ~/.cache)"
        path = Path(self.cache_dir).expanduser() if self.cache_dir else default_cache_root()
        return {key: (path, f"set data.cache_dir to a folder you can write (or ${CACHE_VARIABLE} for every run)")}

    def test_split_hint(self, trained: bool) -> str:
        if trained:
            return ("Test a run on files it never trained on, data.test_files=PATH (rows in the shape of data.files), "
                    "or on the documents it held out: data.test_percent as the run trained with it (a run trained "
                    "with data.test_percent=0 held none out; raising it now would test on documents it trained on).")
        return ("Give it one: data.test_files=PATH (files of their own), or data.test_percent=10 (a tenth of the "
                "documents of data.files, held out by a hash of each).")

    def fingerprint(self) -> str | None:
        """The prepared data's identity (files, sizes, tokenizer, settings, counts): kept in checkpoints."""
        manifest = read_manifest(self._store)
        return manifest.get("fingerprint") if manifest else None

    def splits(self) -> tuple:
        """(train, val, test), opened once; a split too small for one sample is refused here (by
        prepare_data, before training starts)."""
        if self._opened is None:
            self._opened = self._open_splits()
        return self._opened

    def _open_splits(self) -> tuple:
        splits = {"train": self._dataset("train"), "val": self._dataset("val") if self.has_val_split else None,
                  "test": self._dataset("test") if self.has_test_split else None}
        for name, dataset in splits.items():
            if dataset is not None and not self.streaming and len(dataset) == 0:
                view = dataset.split
                what = (f"{view.tokens_total:,} tokens in {view.documents:,} document(s)" if view.documents else
                        "no document")
                raise ConfigError(f"data: the {SPLIT_NAMES[name]} split holds {what}, which makes no sample of "
                                  f"data.block_size={self.block_size} tokens; add text, lower data.block_size, or split "
                                  "plain text finer (data.text_unit=paragraph or line).")
        return splits["train"], splits["val"], splits["test"]

    @property
    def has_val_split(self) -> bool:
        """False with data.val_percent=0 and no val_files: the run trains without validating."""
        return bool(self.val_files) or self.val_percent > 0

    @property
    def has_test_split(self) -> bool:
        return bool(self.test_files) or self.test_percent > 0

    def train_dataset(self) -> Dataset:
        return self.splits()[0]

    def val_dataset(self) -> Dataset:
        return self.splits()[1]

    def test_dataset(self) -> Dataset | None:
        return self.splits()[2]

    def collate(self):
        return None if self.packing else PadCollate(self.tokenizer.pad_id)

