"""Your own text: local files (plain text, JSON lines, JSON arrays, parquet, CSV, each optionally
compressed; globs or folders), tokenised once into a store every rank memory-maps
(framework/data/prepare.py, framework/data/store.py), by bytes or by a local tokenizer, then served
as packed blocks or one document a sample, padded per batch.

Preparation streams the files (never the whole corpus in memory), tokenises them in
`data.num_proc` processes and is reused by every later run, rank and resume until a file, the
tokenizer's contents or a setting that changes the tokens changes. A document is held out for
validation (and testing) by a hash of its own text, so the split is the same at every world size
and a growing corpus never moves validation into training. Memory and disk are flat per token: the
store keeps 1 byte a token for bytes, 2 with a vocabulary up to 65,536, 4 beyond, and a rank reads
it mapped, with 8 bytes a document in memory.

Batches are dicts in Hugging Face's convention: input_ids, plus attention_mask and labels (-100 on
padding) when padded; framework/tasks/language_modeling.py reads them.
"""
from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from framework.config.resolvers import BYTES
from framework.config.types import NonNegativeInt, PositiveInt
from framework.data.base import DataModule
from framework.data.prepare import CACHE_VARIABLE, MISSING, Encoded, StoreSpec, default_cache_root, file_sha256, prepare
from framework.data.sources import TEXT_UNITS, RowError, expand, file_format, read_rows
from framework.data.splits import FILE_ROLES, SPLIT_NAMES, SplitRule
from framework.data.store import Documents, PackedTokens, open_split, read_manifest, shared_documents
from framework.data.stream import TokenStream, stream_fingerprint
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


class TextEncoder:
    """A batch of a file's rows to documents: the text (a plain-text row, or a row's text_field)
    tokenised, ended by the end-of-text token with add_eos; its split is chosen by a hash of its
    UTF-8 text. Pickled to the preparing processes."""

    def __init__(self, tokenizer: str, text_field: str, add_eos: bool):
        self.tokenizer, self.text_field, self.add_eos = tokenizer, text_field, add_eos

    def __call__(self, path: str, rows: list) -> list:
        texts, out = [], []
        for row in rows:
            text = row if isinstance(row, str) else row.get(self.text_field)
            if text is None:
                out.append(MISSING)
                continue
            texts.append(str(text))
            out.append(None)
        tok = loaded_tokenizer(self.tokenizer)
        eos = np.array([tok.eos_id], dtype=np.int64) if self.add_eos and tok.eos_id is not None else None
        encoded = iter(zip(texts, tok.encode_numpy(texts)))
        for i, slot in enumerate(out):
            if slot is None:
                text, ids = next(encoded)
                out[i] = Encoded(text.encode("utf-8"), ids if eos is None else np.concatenate([ids, eos]))
        return out


def _named(files: list[str], most: int = 3) -> str:
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


class TextFiles(DataModule):
    """Local text files as token blocks (packing) or padded documents, from a prepared store."""

    kind = "text"

    def __init__(self, files: str | list[str], val_files: str | list[str] | None = None, val_percent: PositiveInt = 5,
                 test_files: str | list[str] | None = None, test_percent: NonNegativeInt = 0, format: str | None = None,
                 text_field: str = "text", text_unit: str = "document", separator: str | None = None,
                 tokenizer: str = BYTES, block_size: PositiveInt = 128, packing: bool = True, add_eos: bool = True,
                 cache_dir: str | None = None, num_proc: PositiveInt | None = None, token_dtype: str = "auto",
                 allow_changed: bool = False, streaming: bool = False, stream_window: PositiveInt = 1024, **loader):
        """files: glob patterns or folders of the training files (and of the validation and test
        documents too, unless val_files / test_files are given); val_files: patterns of separate
        validation files; val_percent: share of documents held out for validation when val_files is
        null (by a hash of each document's text; at least one document); test_files: patterns of
        separate test files; test_percent: share held out for testing when test_files is null (the
        next buckets of the same hash; 0 and no test_files: no test split); format: text, jsonl
        (JSON lines), json (an array of rows, or JSON lines), parquet or csv (null: from the suffix;
        .gz, .bz2 and .zst files are decompressed); text_field: the field holding the text (all but
        plain text); text_unit: one document of a plain-text file is the whole file (document), a
        paragraph or a line; separator: split plain text into documents on this string instead
        (e.g. '<|endoftext|>'); tokenizer: bytes (256 ids, no file) or a tokenizer.json / a
        directory holding one; block_size: tokens per sample; packing: documents end to end, cut
        into full blocks (false: one document a sample, truncated to block_size and padded per
        batch); add_eos: end each document with the tokenizer's end-of-text token when it has one;
        cache_dir: where prepared data is kept (null: ~/.cache/framework/data); num_proc: processes
        that prepare (null: the machine's cores; the result is the same for any number);
        token_dtype: the store's integer type (auto: the smallest holding every id: uint8 for bytes,
        uint16 up to 65,536 tokens, else uint32);
        allow_changed: resume a checkpoint even though the data differs from the data it was
        trained on (refused otherwise); streaming: read the files while training instead of
        preparing a store (framework/data/stream.py: nothing copied, every rank reads the stream,
        passes follow each other with no epochs); stream_window: samples of the stream shuffled
        together (with the order of the files, drawn each pass)."""
        super().__init__(**loader)
        if text_unit not in TEXT_UNITS:
            raise ConfigError(f"data.text_unit={text_unit!r}: choose one of {', '.join(TEXT_UNITS)}.")
        if not 0 < val_percent < 100:
            raise ConfigError(f"data.val_percent={val_percent}: must be between 1 and 99.")
        if not test_files and val_percent + test_percent >= 100:
            raise ConfigError(f"data.test_percent={test_percent}: with data.val_percent={val_percent} no row is left to "
                              "train on; keep their sum below 100, or give data.test_files.")
        given = {"files": files, "val_files": val_files, "test_files": test_files}
        self.patterns = {key: [os.path.abspath(os.path.expanduser(str(p))) for p in ([v] if isinstance(v, str) else v)]
                         for key, v in given.items() if v}
        found = {role: expand(given[role], f"data.{role}") if given[role] else None for role in FILE_ROLES}
        self.files, self.val_files, self.test_files = found["files"], found["val_files"], found["test_files"]
        self.test_percent = 0 if self.test_files else test_percent
        self._opened: tuple | None = None  # the splits, once opened (splits())
        self.format = file_format(self.files + (self.val_files or []) + (self.test_files or []), format, "data.files")
        self.text_field = text_field
        self.text_unit = text_unit
        self.separator = separator
        self.val_percent = val_percent
        self.tokenizer = loaded_tokenizer(str(tokenizer))
        self.block_size = block_size
        self.packing = packing
        self.add_eos = add_eos
        self.cache_dir = os.path.abspath(os.path.expanduser(cache_dir)) if cache_dir else None
        self.num_proc = num_proc
        self.token_dtype = store_dtype(self.tokenizer, token_dtype)
        self.allow_changed = allow_changed
        self.streaming = streaming
        self.stream_window = stream_window

    # ---- checks before launch ------------------------------------------------------------
    def problems(self) -> list[str]:
        """Each file opened: empty files, first rows that do not parse, a text_field they lack."""
        found = []
        for key, files in ((f"data.{role}", files) for role, files in self.roles().items()):
            empty = [f for f in files if os.path.getsize(f) == 0]
            if self.format == "text":
                if files and len(empty) == len(files):
                    found.append(f"{key}: every file is empty ({_named(empty)}); give files with text.")
                continue
            found += [f"{key}: {f} is empty (a {self.format} file needs at least one row); remove it from "
                      f"{key} or fill it." for f in empty]
            for path in (f for f in files if f not in empty):
                found += self._row_problems(key, path)
                if len(found) >= 10:
                    return found + [f"{key}: (more files not checked after 10 problems)"]
        return found

    def _row_problems(self, key: str, path: str) -> list[str]:
        rows = first_rows(path, self.format)
        if isinstance(rows, str):
            return [f"{key}: {path}: {rows}."]
        if self.text_field not in rows[0]:
            return [f"data.text_field={self.text_field!r}: {path} has no such field (its first row has "
                    f"{', '.join(map(str, rows[0])) or 'none'}); set data.text_field to the one holding the text."]
        return []

    def roles(self) -> dict[str, list[str]]:
        """Each file role (framework/data/splits.py FILE_ROLES) and its files."""
        return {role: getattr(self, role) or [] for role in FILE_ROLES}

    # ---- the prepared store ----------------------------------------------------------------
    def encoder(self):
        return TextEncoder(self.tokenizer.spec, self.text_field, self.add_eos)

    def settings(self) -> dict:
        """Every setting that changes the tokens (the store's identity besides files and tokenizer)."""
        return {"text_field": self.text_field, "text_unit": self.text_unit, "separator": self.separator,
                "add_eos": self.add_eos}

    def store_spec(self) -> StoreSpec:
        return StoreSpec(kind=self.kind, roles=self.roles(),
                         patterns=self.patterns, tokenizer=self._tokenizer_identity(),
                         format=self.format, settings=self.settings(), tokenizer_sha256=self.tokenizer.sha256(),
                         dtype=self.token_dtype, encoder=self.encoder(),
                         cache_root=Path(self.cache_dir) if self.cache_dir else default_cache_root(),
                         num_proc=self.num_proc or os.cpu_count() or 1, text_unit=self.text_unit,
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

    def missing_message(self) -> str:
        return (f"data.text_field={self.text_field!r}: {{count}} row(s) have no such field (the first: {{where}}); fix "
                "those rows, or set data.text_field to the field every row holds.")

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

    def test_overlap(self, trained: TextFiles) -> str | None:
        if not isinstance(trained, TextFiles):
            return None
        trained_files = set(trained.files)
        if self.test_files:
            shared = sorted(set(self.test_files) & trained_files)
            if shared:
                return f"data.test_files holds files the run trained on ({_named(shared)}: data.files then)"
            return self._trained_contents(trained)
        shared = sorted(set(self.files) & trained_files)
        tested = self.split_rule.held_out("test")
        low, high = max(tested[0], trained.split_rule.first_training_bucket()), tested[1]
        if not shared or low >= high:
            return None
        return (f"data.test_percent={self.test_percent} holds out documents of {_named(shared)} that the run trained on "
                f"(it held out data.val_percent={trained.val_percent} and data.test_percent={trained.test_percent}: "
                f"{high - low}% of these documents trained)")

    def _trained_contents(self, trained: TextFiles) -> str | None:
        """data.test_files that hold what the run trained on under other names: a copy of a training
        file (the same bytes), or documents with the same tokens as training documents (rows copied
        out of data.files), compared through the prepared stores."""
        trained_hashes = {file_sha256(path): path for path in trained.files}
        copies = sorted(f"{path} = {trained_hashes[digest]}" for path, digest in
                        ((path, file_sha256(path)) for path in self.test_files) if digest in trained_hashes)
        if copies:
            return f"data.test_files holds copies of files the run trained on ({_named(copies)})"
        if self.streaming or trained.streaming:
            return None  # a stream keeps no store to compare documents in
        tested, trained_split = open_split(self._store, "test"), open_split(trained._store, "train")
        if tested is None or trained_split is None or not tested.documents:
            return None
        shared = shared_documents(tested, trained_split)
        return (f"data.test_files holds {shared} of its {tested.documents} document(s) with the tokens of documents the "
                f"run trained on (rows copied from {_named(sorted(trained.files))})" if shared else None)

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
        if self.streaming:
            return stream_fingerprint(self._stream_spec, self.block_size, self.packing)
        manifest = read_manifest(self._store)
        return manifest.get("fingerprint") if manifest else None

    def _dataset(self, split: str) -> Dataset:
        if self.streaming:
            return TokenStream(self._stream_spec, split, self.block_size, self.packing, shuffle=self.shuffle,
                               window=self.stream_window)
        view = open_split(self._store, split)
        return PackedTokens(view, self.block_size) if self.packing else Documents(view, self.block_size)

    def splits(self) -> tuple:
        """(train, val, test), opened once; a split too small for one sample is refused here (by
        prepare_data, before training starts)."""
        if self._opened is None:
            self._opened = self._open_splits()
        return self._opened

    def _open_splits(self) -> tuple:
        splits = {"train": self._dataset("train"), "val": self._dataset("val"),
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
    def has_test_split(self) -> bool:
        return bool(self.test_files) or self.test_percent > 0

    def run_problems(self, trainer, stage: str) -> list[str]:
        """A stream has no epochs and no end to score to: it needs trainer.max_steps, and a number
        of batches for each split it evaluates (their first samples)."""
        if not self.streaming:
            return []
        found = []
        if stage == "fit" and trainer.get("max_steps") is None:
            found.append("data.streaming=true: a stream has no epochs (its passes follow each other), so "
                         "trainer.max_epochs cannot end the run; give trainer.max_steps.")
        if stage == "fit" and trainer.get("val_batches") is None:
            found.append("data.streaming=true: validation scores the first trainer.val_batches batches of the streamed "
                         "validation split; trainer.val_batches=null would read all of it at every validation. Give "
                         "a number (e.g. trainer.val_batches=20), or prepare the data (data.streaming=false).")
        if (stage == "test" or trainer.get("test_at_end")) and trainer.get("test_batches") is None:
            found.append("data.streaming=true: testing scores the first trainer.test_batches batches of the streamed "
                         "test split; give trainer.test_batches (e.g. 50), or prepare the data (data.streaming=false).")
        return found

    def train_dataset(self) -> Dataset:
        return self.splits()[0]

    def val_dataset(self) -> Dataset:
        return self.splits()[1]

    def test_dataset(self) -> Dataset | None:
        return self.splits()[2]

    def collate(self):
        return None if self.packing else PadCollate(self.tokenizer.pad_id)

    def example_batch(self, size: int = 2):
        """A batch of the right shape and keys, without reading the files."""
        ids = torch.zeros(size, self.block_size, dtype=torch.long)
        if self.packing:
            return {"input_ids": ids}
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
