"""data.streaming=true: a corpus read from its files while it trains, never copied into a store.

The training stream is an endless sequence of samples, pass after pass over the files. A pass
reads the units (whole files, or byte ranges of large line-based ones: framework/data/sources.py)
in an order drawn from seed + pass, keeps the documents of the split (by the store's own rule:
framework/data/prepare.py `unit_documents`, a hash of each document), and lays their tokens end to
end, cut into blocks of `block_size` (the pass's last partial block is left out), or one document
a sample (packing=false). Windows of `window` consecutive samples are permuted by seed, pass and
window. Unshuffled, a pass is exactly the prepared store's training split, in its order.

Positions. Sample p of the stream is the same at every world size, batch size and number of loader
workers; the loader deals positions as it deals a map-style set's (framework/data/sampler.py: rank
r of w takes r, r + w, ...), so a checkpoint's position, counted in samples, resumes the stream
exactly, at any world size. A dataset object serves positions in increasing order, reading one
window ahead; a position behind its window (a resume, a loader worker started again) starts the
pass that holds it again, skipping, unread, the units whose tokens are known: each unit's count
(tokens and documents) is kept when it is read to its end, in a small file beside the stores
(`stream-<key>-<split>.json`: a few bytes a unit), checked against the files' sizes and times and the tokenizer's hash.

Every rank (and every loader worker) reads the whole stream and keeps its own positions: the
price of not preparing, small for byte tokens and heavy for a slow tokenizer (then prepare).
Validation and test read the first samples of their split, the units in file order (`head`).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset

from framework.data.prepare import MISSING, StoreSpec, unit_documents
from framework.data.sources import plan_units
from framework.data.splits import FILE_ROLES, SPLIT_NAMES
from framework.errors import ConfigError

STREAM_LENGTH = 1 << 60  # the positions of an endless stream (its sampler deals them lazily)


def stream_fingerprint(spec: StoreSpec, block_size: int, packing: bool) -> str:
    """What identifies streamed data (files with sizes and times, tokenizer, settings, split rule,
    sample shape): kept in checkpoints like a store's fingerprint."""
    identity = {"files": spec.file_stats(), "tokenizer_sha256": spec.tokenizer_sha256, "settings": spec.settings,
                "format": spec.format, "split": [spec.val_percent, spec.test_percent], "block_size": block_size,
                "packing": packing, "streaming": True}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


class UnitCounts:
    """Each unit's tokens and documents in one split, as far as known: a small file beside the
    stores, valid while the files and the tokenizer are the ones it was counted from."""

    def __init__(self, spec: StoreSpec, split: str):
        self.path = Path(spec.cache_root) / f"stream-{spec.key()}-{split}.json"
        self.identity = json.loads(json.dumps({"files": spec.file_stats(), "tokenizer_sha256": spec.tokenizer_sha256}))
        self.counts: dict[int, tuple[int, int]] = self._saved()

    def _saved(self) -> dict[int, tuple[int, int]]:
        try:
            saved = json.loads(self.path.read_text())
            if saved.get("identity") == self.identity:
                return {int(k): (int(v[0]), int(v[1])) for k, v in saved["units"].items()}
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            pass
        return {}

    def get(self, unit: int) -> tuple[int, int] | None:
        """(tokens, documents) of `unit` in this split, or None where it was never read to its end."""
        return self.counts.get(unit)

    def remember(self, unit: int, tokens: int, documents: int) -> None:
        if self.counts.get(unit) == (tokens, documents):
            return
        # merged with what other processes counted; a lost race only costs a later re-read
        self.counts = {**self._saved(), **self.counts, unit: (tokens, documents)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            temporary.write_text(json.dumps({"identity": self.identity,
                                             "units": {k: list(v) for k, v in self.counts.items()}}))
            temporary.replace(self.path)
        except OSError:
            pass  # a read-only cache: the counts stay in this process


class TokenStream(Dataset):
    """One split of the files, streamed: `len` is endless for training (positions past a pass go
    on into the next), and `head(n)` is the first n samples, for evaluation."""

    streamed = True  # the loader deals it in order and leaves the shuffling to it (framework/data/loaders.py)

    def __init__(self, spec: StoreSpec, split: str, block_size: int, packing: bool, shuffle: bool = True,
                 window: int = 1024, seed: int = 0):
        self.spec, self.split, self.block_size, self.packing = spec, split, block_size, packing
        self.shuffle, self.window, self.seed = shuffle, max(1, int(window)), seed
        self.units = [u for u in plan_units(spec.files, spec.format, spec.text_unit, spec.separator)
                      if spec.split_rule.may_hold(FILE_ROLES[spec.role_of(u.file)], split)]
        self.counts = UnitCounts(spec, split)
        self._restart_at(0)

    def seeded(self, seed: int) -> "TokenStream":
        """The stream's shuffling drawn from `seed` (the run's): set by the loader."""
        if seed != self.seed:
            self.seed = seed
            self._restart_at(0)
        return self

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_reader"] = None  # a loader worker starts its own reading where it is asked
        state["_window_start"], state["_samples"] = 0, []
        state["_pass"], state["_in_pass"] = 0, 0
        return state

    def __len__(self) -> int:
        return STREAM_LENGTH

    def __getitem__(self, position: int):
        position = int(position)
        if position < self._window_start or self._reader is None:
            self._restart_at(position)
        while position >= self._window_start + len(self._samples):
            self._next_window()
        return self._sample(self._samples[position - self._window_start])

    # ---- evaluation: the split's first samples ---------------------------------------------
    def head(self, count: int) -> Dataset:
        """The first `count` samples of the split (fewer where it has fewer), units in file order,
        unshuffled: what evaluation scores, the same at every world size."""
        samples = list(itertools.islice(self._pass_samples(range(len(self.units)), 0), count))
        if not samples:
            raise ConfigError(f"data: the {SPLIT_NAMES[self.split]} split of the streamed files holds no sample of "
                              f"data.block_size={self.block_size} tokens; add text, lower data.block_size, or raise "
                              f"data.val_percent / data.test_percent.")
        return _Head([self._sample(s) for s in samples])

    # ---- reading forward ---------------------------------------------------------------------
    def _sample(self, tokens: np.ndarray) -> dict:
        return {"input_ids": torch.from_numpy(tokens.astype(np.int64))}

    def _unit_order(self, pass_index: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.units)))
        return np.random.default_rng([self.seed, pass_index]).permutation(len(self.units)).tolist()

    def _pass_length(self) -> int | None:
        """Samples in a pass, when every unit's counts are known: blocks of the total tokens
        (packing), or documents."""
        known = [self.counts.get(u) for u in range(len(self.units))]
        if any(k is None for k in known):
            return None
        if self.packing:
            return sum(tokens for tokens, _ in known) // self.block_size
        return sum(documents for _, documents in known)

    def _restart_at(self, position: int) -> None:
        """Read again from the window that holds `position`: its pass's start, or the window itself
        where the pass length and the units before it are known."""
        length = self._pass_length()
        pass_index, within = (position // length, position % length) if length else (0, 0)
        skip = (within // self.window) * self.window
        self._pass, self._in_pass = pass_index, skip
        self._window_start = (pass_index * length if length else 0) + skip
        self._samples = []
        self._reader = self._pass_samples(self._unit_order(pass_index), skip)

    def _next_window(self) -> None:
        self._window_start += len(self._samples)
        self._in_pass += len(self._samples)
        samples = list(itertools.islice(self._reader, self.window))
        if not samples:  # the pass is over: the next one, in another order
            if self._in_pass == 0:
                raise ConfigError(f"data: the {SPLIT_NAMES[self.split]} split of the streamed files holds no sample "
                                  f"of data.block_size={self.block_size} tokens; add text or lower data.block_size.")
            self._pass, self._in_pass = self._pass + 1, 0
            self._reader = self._pass_samples(self._unit_order(self._pass), 0)
            samples = list(itertools.islice(self._reader, self.window))
        if self.shuffle:
            window_index = self._in_pass // self.window
            order = np.random.default_rng([self.seed, self._pass, window_index, 1]).permutation(len(samples))
            samples = [samples[i] for i in order]
        self._samples = samples

    def _pass_samples(self, order, skip_samples: int) -> Iterator[np.ndarray]:
        """The samples of one pass over the units in `order`, from sample `skip_samples` on."""
        if not self.packing:
            yield from (tokens[: self.block_size] for tokens in self._documents(order, skip_documents=skip_samples))
            return
        pieces, held = [], 0
        for tokens in self._documents(order, skip_tokens=skip_samples * self.block_size):
            pieces.append(tokens)
            held += len(tokens)
            if held < self.block_size:
                continue
            joined = np.concatenate(pieces)
            whole = held // self.block_size
            for b in range(whole):
                yield joined[b * self.block_size:(b + 1) * self.block_size]
            pieces, held = [joined[whole * self.block_size:]], held - whole * self.block_size

    def _documents(self, order, skip_tokens: int = 0, skip_documents: int = 0) -> Iterator[np.ndarray]:
        """The split's documents' tokens, the units in `order`, the first `skip_tokens` tokens or
        `skip_documents` documents left out (whole units skipped unread where their counts are
        known). Empty documents are no sample, as in a store."""
        for unit_index in order:
            known = self.counts.get(unit_index)
            if known is not None and (skip_tokens or skip_documents):
                if skip_tokens and known[0] <= skip_tokens:
                    skip_tokens -= known[0]
                    continue
                if skip_documents and known[1] <= skip_documents:
                    skip_documents -= known[1]
                    continue
            tokens_read = documents_read = 0
            unit = self.units[unit_index]
            for split, doc, _, position in unit_documents(self.spec, unit):
                if doc is MISSING:
                    kind = "byte" if self.spec.format in ("jsonl", "text") else "row"
                    raise ConfigError(self.spec.missing.format(count="some",
                                                               where=f"{self.spec.files[unit.file]}, {kind} {position}"))
                if split != self.split or not len(doc.tokens):
                    continue
                tokens = doc.tokens
                tokens_read += len(tokens)
                documents_read += 1
                if skip_documents:
                    skip_documents -= 1
                    continue
                if skip_tokens:
                    if len(tokens) <= skip_tokens:
                        skip_tokens -= len(tokens)
                        continue
                    tokens, skip_tokens = tokens[skip_tokens:], 0
                yield tokens
            self.counts.remember(unit_index, tokens_read, documents_read)


class _Head(Dataset):
    """The first samples of a streamed split, held (evaluation's share: a few batches)."""

    def __init__(self, samples: list[dict]):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        return self.samples[i]
