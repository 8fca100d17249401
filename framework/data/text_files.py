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

import os

import torch
from torch.utils.data import Dataset

from framework.config.resolvers import BYTES
from framework.config.types import NonNegativeInt, PositiveInt
from framework.data.prepare import MISSING, Encoded
from framework.data.sources import TEXT_UNITS
from framework.data.store import Documents, PackedTokens, open_split
from framework.data.stored_files import StoredFiles, first_rows, named
from framework.data.stream import TokenStream, stream_fingerprint
from framework.data.tokenizer import loaded_tokenizer
from framework.errors import ConfigError


class TextEncoder:
    """A batch of a file's rows to documents: the text (a plain-text row, or a row's text_field)
    tokenised as transformers' tokenizer(text) does (the family's bos first where it adds one),
    ended by the end-of-text token with add_eos; its split is chosen by a hash of its UTF-8 text.
    Pickled to the preparing processes."""

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
        encoded = iter(zip(texts, loaded_tokenizer(self.tokenizer).document(texts, end=self.add_eos)))
        for i, slot in enumerate(out):
            if slot is None:
                text, ids = next(encoded)
                out[i] = Encoded(text.encode("utf-8"), ids)
        return out


class TextFiles(StoredFiles):
    """Local text files as token blocks (packing) or padded documents, from a prepared store."""

    #: what its batches are (framework/data/batch_kinds.py)
    batch_kind = "tokens"

    kind = "text"

    def __init__(self, files: str | list[str], val_files: str | list[str] | None = None, val_percent: NonNegativeInt = 5,
                 test_files: str | list[str] | None = None, test_percent: NonNegativeInt = 0, format: str | None = None,
                 text_field: str = "text", text_unit: str = "document", separator: str | None = None,
                 tokenizer: str = BYTES, block_size: PositiveInt = 128, packing: bool = True, add_eos: bool = True,
                 cache_dir: str | None = None, num_proc: PositiveInt | None = None, token_dtype: str = "auto",
                 allow_changed: bool = False, streaming: bool = False, stream_window: PositiveInt = 1024, **loader):
        """files: glob patterns or folders of the training files (and of the validation and test
        documents too, unless val_files / test_files are given); val_files: patterns of separate
        validation files; val_percent: share of documents held out for validation when val_files is
        null (by a hash of each document's text; at least one document; 0: no validation split, the
        run trains without validating); test_files: patterns of
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
        that prepare (null: the machine's cores, or the run's own process for less than 4 MiB of
        files; the result is the same for any number);
        token_dtype: the store's integer type (auto: the smallest holding every id: uint8 for bytes,
        uint16 up to 65,536 tokens, else uint32);
        allow_changed: resume a checkpoint even though the data differs from the data it was
        trained on (refused otherwise); streaming: read the files while training instead of
        preparing a store (framework/data/stream.py: nothing copied, every rank reads the stream,
        passes follow each other with no epochs); stream_window: samples of the stream shuffled
        together (with the order of the files, drawn each pass)."""
        if text_unit not in TEXT_UNITS:
            raise ConfigError(f"data.text_unit={text_unit!r}: choose one of {', '.join(TEXT_UNITS)}.")
        super().__init__(files=files, val_files=val_files, val_percent=val_percent, test_files=test_files,
                         test_percent=test_percent, format=format, tokenizer=tokenizer, block_size=block_size,
                         packing=packing, cache_dir=cache_dir, num_proc=num_proc, token_dtype=token_dtype,
                         allow_changed=allow_changed, **loader)
        self.text_field = text_field
        self.text_unit = text_unit
        self.separator = separator
        self.add_eos = add_eos
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
                    found.append(f"{key}: every file is empty ({named(empty)}); give files with text.")
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

    # ---- the prepared store ----------------------------------------------------------------
    def encoder(self):
        return TextEncoder(self.tokenizer.spec, self.text_field, self.add_eos)

    def settings(self) -> dict:
        """Every setting that changes the tokens (the store's identity besides files and tokenizer)."""
        return {"text_field": self.text_field, "text_unit": self.text_unit, "separator": self.separator,
                "add_eos": self.add_eos}

    def missing_message(self) -> str:
        return (f"data.text_field={self.text_field!r}: {{count}} row(s) have no such field (the first: {{where}}); fix "
                "those rows, or set data.text_field to the field every row holds.")

    def fingerprint(self) -> str | None:
        if self.streaming:
            return stream_fingerprint(self._stream_spec, self.block_size, self.packing)
        return super().fingerprint()

    def _dataset(self, split: str) -> Dataset:
        if self.streaming:
            return TokenStream(self._stream_spec, split, self.block_size, self.packing, shuffle=self.shuffle,
                               window=self.stream_window)
        view = open_split(self._store, split)
        return PackedTokens(view, self.block_size) if self.packing else Documents(view, self.block_size)

    def run_problems(self, trainer, mode: str) -> list[str]:
        """A stream has no epochs and no end to score to: it needs trainer.max_steps, and a number
        of batches for each split it evaluates (their first samples)."""
        if not self.streaming:
            return []
        found = []
        if mode == "fit" and trainer.get("max_steps") is None:
            found.append("data.streaming=true: a stream has no epochs (its passes follow each other), so "
                         "trainer.max_epochs cannot end the run; give trainer.max_steps.")
        if mode == "fit" and trainer.get("val_batches") is None:
            found.append("data.streaming=true: validation scores the first trainer.val_batches batches of the streamed "
                         "validation split; trainer.val_batches=null would read all of it at every validation. Give "
                         "a number (e.g. trainer.val_batches=20), or prepare the data (data.streaming=false).")
        if (mode == "test" or trainer.get("test_at_end")) and trainer.get("test_batches") is None:
            found.append("data.streaming=true: testing scores the first trainer.test_batches batches of the streamed "
                         "test split; give trainer.test_batches (e.g. 50), or prepare the data (data.streaming=false).")
        return found

    def example_batch(self, size: int = 2):
        """A batch of the right shape and keys, without reading the files."""
        ids = torch.zeros(size, self.block_size, dtype=torch.long)
        if self.packing:
            return {"input_ids": ids}
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
