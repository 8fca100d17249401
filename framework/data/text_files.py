"""Your own text: local files (plain text, JSON lines, parquet, CSV; glob patterns) read with the
`datasets` library, tokenised by bytes or by a local tokenizer, then packed into blocks or padded.

Preprocessing (reading, tokenising, packing) happens once: `prepare_data()` runs on one process
per node before the others start theirs, and `datasets` caches each result by its inputs, so the
other ranks, later runs and resumed runs load it from the cache. The result is a map-style
dataset, so the framework's sampler shards it and a resumed run continues mid-epoch exactly.

Batches are dicts in Hugging Face's convention: input_ids, plus attention_mask and labels (-100 on
padding) when padded; framework/tasks/language_modeling.py reads them.
"""
from __future__ import annotations

import csv
import functools
import glob
import itertools
import json
import os
import zlib
from functools import cached_property
from pathlib import Path

import torch
from torch.utils.data import Dataset

from framework.config.resolvers import BYTES, tokenizer_file
from framework.config.types import NonNegativeInt, PositiveInt
from framework.data.base import DataModule
from framework.errors import ConfigError

# The `datasets` builder for each file suffix.
FORMATS = {".txt": "text", ".text": "text", ".md": "text", ".py": "text", ".json": "json", ".jsonl": "json",
           ".parquet": "parquet", ".csv": "csv"}
TEXT_UNITS = ("document", "paragraph", "line")  # what one sample of a plain-text file is
EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "[SEP]")


def expand(patterns: str | list[str], key: str) -> list[str]:
    """Every file the glob patterns match (`**` included), sorted; a pattern matching nothing is
    refused, named."""
    files = []
    for pattern in [patterns] if isinstance(patterns, str) else list(patterns):
        matched = sorted(p for p in glob.glob(os.path.expanduser(str(pattern)), recursive=True) if os.path.isfile(p))
        if not matched:
            raise ConfigError(f"{key}: the pattern {str(pattern)!r} matches no file (relative patterns are read from "
                              f"{os.getcwd()}).")
        files += [os.path.abspath(p) for p in matched]
    return list(dict.fromkeys(files))


def file_format(files: list[str], given: str | None, key: str) -> str:
    if given:
        if given not in set(FORMATS.values()):
            raise ConfigError(f"data.format={given!r}: choose one of {', '.join(sorted(set(FORMATS.values())))}, "
                              "or null to tell it from the file suffixes.")
        return given
    found = {FORMATS.get(Path(f).suffix.lower()) for f in files}
    if None in found or len(found) != 1:
        suffixes = sorted({Path(f).suffix or "(none)" for f in files})
        raise ConfigError(f"{key}: cannot tell one format from the suffixes {', '.join(suffixes)}; set data.format "
                          f"to one of {', '.join(sorted(set(FORMATS.values())))}.")
    return found.pop()


class Tokenizer:
    """Bytes (256 ids, no file) or a local tokenizer.json (the `tokenizers` library)."""

    def __init__(self, spec: str):
        self.spec = str(spec)
        self.eos_id: int | None = None
        self.pad_id = 0
        self._tokenizer = None
        if self.spec != BYTES:
            from tokenizers import Tokenizer as HFTokenizer

            self._tokenizer = HFTokenizer.from_file(str(tokenizer_file(self.spec)))
            ids = [self._tokenizer.token_to_id(name) for name in EOS_NAMES]
            self.eos_id = next((i for i in ids if i is not None), None)
            self.pad_id = self.eos_id if self.eos_id is not None else 0

    def token_id(self, token: str) -> int | None:
        """The id of one token of the vocabulary (a special token's), or None."""
        return None if self._tokenizer is None else self._tokenizer.token_to_id(token)

    def encode(self, texts: list[str]) -> list[list[int]]:
        if self._tokenizer is None:
            return [list(text.encode("utf-8")) for text in texts]
        return [e.ids for e in self._tokenizer.encode_batch(texts, add_special_tokens=False)]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[int]]:
        """One text's token ids and, for each, the index of the character where it starts."""
        if self._tokenizer is None:
            ids, starts = [], []
            for index, char in enumerate(text):
                encoded = char.encode("utf-8", errors="replace")
                ids += encoded
                starts += [index] * len(encoded)
            return ids, starts
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        return encoding.ids, [start for start, _ in encoding.offsets]

    def decode(self, ids: list[int]) -> str:
        """Text of token ids (bytes that are not valid UTF-8 become U+FFFD)."""
        if self._tokenizer is None:
            return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    @property
    def vocab_size(self) -> int:
        return 256 if self._tokenizer is None else self._tokenizer.get_vocab_size()


@functools.lru_cache(maxsize=4)
def loaded_tokenizer(spec: str) -> Tokenizer:
    return Tokenizer(spec)


class _Tokenise:
    """The map function that tokenises a batch of rows (a class, so `datasets` hashes it for its cache)."""

    def __init__(self, tokenizer: str, field: str, add_eos: bool):
        self.tokenizer, self.field, self.add_eos = tokenizer, field, add_eos

    def __call__(self, rows):
        tok = loaded_tokenizer(self.tokenizer)  # once per process, not once per batch of rows
        texts = [t if isinstance(t, str) else "" for t in rows[self.field]]
        ids = tok.encode(texts)
        if self.add_eos and tok.eos_id is not None:
            ids = [i + [tok.eos_id] for i in ids]
        return {"input_ids": ids}


class _Pack:
    """Concatenates a batch of tokenised rows and cuts it into blocks of block_size (the remainder
    of each batch of rows is dropped)."""

    def __init__(self, block_size: int):
        self.block_size = block_size

    def __call__(self, rows):
        flat = [t for ids in rows["input_ids"] for t in ids]
        n = len(flat) // self.block_size * self.block_size
        return {"input_ids": [flat[i:i + self.block_size] for i in range(0, n, self.block_size)]}


class _Truncate:
    def __init__(self, block_size: int):
        self.block_size = block_size

    def __call__(self, rows):
        return {"input_ids": [ids[:self.block_size] for ids in rows["input_ids"] if ids]}


def _named(files: list[str], most: int = 3) -> str:
    return ", ".join(files[:most]) + (f" and {len(files) - most} more" if len(files) > most else "")


def first_rows(path: str, fmt: str, count: int = 1) -> list[dict] | str:
    """A file's first `count` rows as dicts (a string saying what is wrong when they do not read)."""
    try:
        if fmt == "json":
            rows = []
            with open(path, encoding="utf-8") as f:
                for line in (ln for ln in f if ln.strip()):
                    row = json.loads(line)
                    if not isinstance(row, dict):
                        return f"has a {'first ' if not rows else ''}row that is not a JSON object ({line[:60]!r})"
                    rows.append(row)
                    if len(rows) == count:
                        break
            return rows or "holds only blank lines"
        if fmt == "csv":
            with open(path, newline="", encoding="utf-8") as f:
                return list(itertools.islice(csv.DictReader(f), count))
        if fmt == "parquet":
            import pyarrow.parquet

            return next(pyarrow.parquet.ParquetFile(path).iter_batches(batch_size=count)).to_pylist()
    except (OSError, UnicodeDecodeError, ValueError, StopIteration) as err:
        return f"does not read as {fmt} ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
    return []


def _columns(path: str, fmt: str) -> list[str] | str:
    """The field names of a file's first row (a string saying what is wrong when it cannot tell)."""
    if fmt == "csv":  # the header, even with no row under it
        try:
            with open(path, newline="", encoding="utf-8") as f:
                return next(csv.reader(f), [])
        except (OSError, UnicodeDecodeError) as err:
            return f"does not read as csv ({type(err).__name__}: {err})"
    rows = first_rows(path, fmt)
    return rows if isinstance(rows, str) else list(rows[0]) if rows else []


class TokenRows(Dataset):
    """A processed `datasets` table as tensors: {"input_ids": LongTensor, ...} (every column)."""

    def __init__(self, table):
        self.table = table.with_format("torch")

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i: int):
        return {name: column.long() for name, column in self.table[int(i)].items()}


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
    """Local text files as token blocks (packing) or padded rows."""

    def __init__(self, files: str | list[str], val_files: str | list[str] | None = None, val_percent: PositiveInt = 5,
                 test_files: str | list[str] | None = None, test_percent: NonNegativeInt = 0, format: str | None = None, text_field: str = "text", text_unit: str = "document",
                 tokenizer: str = BYTES, block_size: PositiveInt = 128, packing: bool = True, add_eos: bool = True,
                 cache_dir: str | None = None, num_proc: PositiveInt | None = None, **loader):
        """files: glob patterns of the training files (and of the validation files too, unless
        val_files is given); val_files: patterns of separate validation files; val_percent: share
        of rows held out for validation when val_files is null (a fixed split, by a hash of the
        row number; at least one row); test_files: patterns of separate test files; test_percent:
        share of rows held out for testing when test_files is null (the next buckets of the same
        hash; 0 and no test_files: the data has no test split); format: text, json (JSON lines), parquet or csv (null: from the suffix);
        text_field: the column holding the text (json, parquet, csv); text_unit: one sample of a
        plain-text file is a document (the whole file), a paragraph or a line; tokenizer: bytes
        (256 ids, no file) or a tokenizer.json / a directory holding one; block_size: tokens per
        sample; packing: concatenate rows and cut them into full blocks (false: one row per
        sample, truncated to block_size and padded per batch); add_eos: end each row with the
        tokenizer's end-of-text token when it has one; cache_dir: where `datasets` keeps the
        processed tables (null: its default, ~/.cache/huggingface/datasets); num_proc: processes
        that preprocess (null: one)."""
        super().__init__(**loader)
        if text_unit not in TEXT_UNITS:
            raise ConfigError(f"data.text_unit={text_unit!r}: choose one of {', '.join(TEXT_UNITS)}.")
        if not 0 < val_percent < 100:
            raise ConfigError(f"data.val_percent={val_percent}: must be between 1 and 99.")
        if not test_files and val_percent + test_percent >= 100:
            raise ConfigError(f"data.test_percent={test_percent}: with data.val_percent={val_percent} no row is left to "
                              "train on; keep their sum below 100, or give data.test_files.")
        self.files = expand(files, "data.files")
        self.val_files = expand(val_files, "data.val_files") if val_files else None
        self.test_files = expand(test_files, "data.test_files") if test_files else None
        self.test_percent = 0 if self.test_files else test_percent
        self.format = file_format(self.files + (self.val_files or []) + (self.test_files or []), format, "data.files")
        self.text_field = text_field
        self.text_unit = text_unit
        self.val_percent = val_percent
        self.tokenizer = loaded_tokenizer(str(tokenizer))
        self.block_size = block_size
        self.packing = packing
        self.add_eos = add_eos
        self.cache_dir = os.path.abspath(os.path.expanduser(cache_dir)) if cache_dir else None
        self.num_proc = num_proc

    # ---- checks before launch ------------------------------------------------------------
    def problems(self) -> list[str]:
        """Each file opened: empty files, rows that do not parse, a text_field the rows lack."""
        found = []
        for key, files in (("data.files", self.files), ("data.val_files", self.val_files or []),
                           ("data.test_files", self.test_files or [])):
            empty = [f for f in files if os.path.getsize(f) == 0]
            if self.format == "text":
                if files and len(empty) == len(files):
                    found.append(f"{key}: every file is empty ({_named(empty)}); give files with text.")
                continue
            found += [f"{key}: {f} is empty (a {self.format} file needs at least one row); remove it from "
                      f"{key} or fill it." for f in empty]
            for path in (f for f in files if f not in empty):
                columns = _columns(path, self.format)
                if isinstance(columns, str):
                    found.append(f"{key}: {path} {columns}.")
                elif self.text_field not in columns:
                    found.append(f"data.text_field={self.text_field!r}: {path} has no such field (its first row "
                                 f"has {', '.join(map(str, columns)) or 'none'}); set data.text_field to the one "
                                 "holding the text.")
                if len(found) >= 10:
                    return found + [f"{key}: (more files not checked after 10 problems)"]
        return found

    # ---- preprocessing (once, cached) ---------------------------------------------------
    def _read(self, files: list[str], key: str):
        """The files' rows as one `datasets` table (every column)."""
        import datasets

        datasets.disable_progress_bars()
        options = {}
        if self.format == "text":
            options = {"sample_by": self.text_unit, "keep_linebreaks": True}
        try:
            return datasets.load_dataset(self.format, data_files={"train": files}, split="train",
                                         cache_dir=self.cache_dir, **options)
        except Exception as err:  # a malformed file: named, with the reader's reason
            raise ConfigError(f"{key}: {self.format} files that do not read ({_named(files)}; {type(err).__name__}"
                              f"{': ' + str(err).splitlines()[0] if str(err) else ''}).") from err

    def _load(self, files: list[str], key: str):
        """The rows' text, as the single column "text"."""
        table = self._read(files, key)
        field = "text" if self.format == "text" else self.text_field
        if field not in table.column_names:
            raise ConfigError(f"data.text_field={field!r}: the {key} files have no such column (they have "
                              f"{', '.join(table.column_names)}).")
        return table.select_columns([field]).rename_column(field, "text") if field != "text" else \
            table.select_columns(["text"])

    def _process(self, table):
        tokenise = _Tokenise(self.tokenizer.spec, "text", self.add_eos)
        table = table.map(tokenise, batched=True, remove_columns=table.column_names, num_proc=self.num_proc)
        shape = _Pack(self.block_size) if self.packing else _Truncate(self.block_size)
        return table.map(shape, batched=True, batch_size=1000, remove_columns=table.column_names,
                         num_proc=self.num_proc)

    @property
    def has_test_split(self) -> bool:
        return bool(self.test_files) or self.test_percent > 0

    def _held_out_rows(self, count: int) -> tuple[list[int], list[int], list[int]]:
        """(train, val, test) row numbers of `files`: a fixed split by a hash of the row number
        (val: the first val_percent buckets, unless val_files is given; test: the next
        test_percent); a small data set still holds out one row for each split it needs."""
        buckets = [zlib.crc32(str(i).encode()) % 100 for i in range(count)]
        val_cut = 0 if self.val_files else self.val_percent
        test_cut = val_cut + self.test_percent
        val = [i for i, b in enumerate(buckets) if b < val_cut]
        test = [i for i, b in enumerate(buckets) if val_cut <= b < test_cut]
        by_bucket = sorted(range(count), key=buckets.__getitem__)
        if val_cut and not val and count > 1:
            val = by_bucket[:1]
        if test_cut > val_cut and not test and count > 2:
            test = [i for i in by_bucket if i not in val][:1]
        held = set(val) | set(test)
        return [i for i in range(count) if i not in held], val, test

    @cached_property
    def _splits(self):
        table = self._load(self.files, "data.files")
        train_rows, val_rows, test_rows = self._held_out_rows(len(table))
        needs = [(not self.val_files, val_rows, f"{self.val_percent}% for validation"),
                 (self.test_percent > 0, test_rows, f"{self.test_percent}% for testing")]
        wanted = [what for needed, _, what in needs if needed]
        short = [what for needed, rows, what in needs if needed and not rows]
        if short or not train_rows:
            raise ConfigError(f"data.files: {len(table)} row(s) of text ({self.format}, text_unit={self.text_unit})"
                              f" are too few to hold out {' and '.join(short or wanted)} and "
                              "train on the rest: add files, give data.val_files / data.test_files, or split plain "
                              "text finer (data.text_unit=paragraph or line).")
        val = self._load(self.val_files, "data.val_files") if self.val_files else table.select(val_rows)
        test = (self._load(self.test_files, "data.test_files") if self.test_files
                else table.select(test_rows) if self.test_percent else None)
        splits = {"training": self._process(table.select(train_rows)), "validation": self._process(val)}
        if test is not None:
            splits["test"] = self._process(test)
        for name, split in splits.items():
            if len(split) == 0:
                raise ConfigError(f"data: the {name} text makes no sample of data.block_size={self.block_size} "
                                  "tokens; add text or lower data.block_size.")
        return tuple(TokenRows(split) for split in splits.values()) + ((None,) if test is None else ())

    def prepare_data(self) -> None:
        """Read, tokenise and pack once into the `datasets` cache (one process per node runs it first)."""
        self._splits  # noqa: B018

    def train_dataset(self) -> Dataset:
        return self._splits[0]

    def val_dataset(self) -> Dataset:
        return self._splits[1]

    def test_dataset(self) -> Dataset | None:
        return self._splits[2]

    def collate(self):
        return None if self.packing else PadCollate(self.tokenizer.pad_id)

    def example_batch(self, size: int = 2):
        """A batch of the right shape and keys, without reading the files."""
        ids = torch.zeros(size, self.block_size, dtype=torch.long)
        if self.packing:
            return {"input_ids": ids}
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
