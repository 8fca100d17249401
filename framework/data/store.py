"""A prepared corpus on disk, read by memory-mapping: per split, token shards (flat uint16 or
uint32 arrays), each with the start of every document in it, and for chat data a flag per token
saying whether the loss scores it; a manifest says what made it (files with their sizes and
modification times, the tokenizer's hash, every setting that changes the tokens).

Opening a split reads the manifest and the document starts (8 bytes a document), nothing else:
token shards are mapped, so a rank's memory holds the pages it reads, whatever the corpus's size,
and every rank on a machine shares them. framework/data/prepare.py writes it.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from framework.sequences import IGNORE_INDEX

MANIFEST = "manifest.json"
VERSION = 1
#: the kinds of store whose tokens carry a flag each (chat data: scored or not; preference pairs:
#: scored or not, and which sequence of the pair: framework/data/preference_files.py)
FLAGGED_KINDS = ("chat", "preference")


def read_manifest(root: Path) -> dict | None:
    """The manifest of a complete store at `root`, or None (absent, unreadable, another version)."""
    try:
        manifest = json.loads((Path(root) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if manifest.get("version") == VERSION else None


def fingerprint(manifest: dict) -> str:
    """What identifies the prepared data: its files (paths, sizes, modification times), tokenizer
    and settings, and what came out (tokens and documents per split). Kept in checkpoints: a
    resume on other data is caught."""
    identity = {k: manifest[k] for k in ("files", "tokenizer_sha256", "settings", "splits_summary")}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


class StoreSplit:
    """One split of a store (train, val or test): its tokens across shards, memory-mapped on first
    use in each process (a loader's worker maps them again, nothing is pickled), and the document
    starts as one array of global token offsets (the last entry: the total)."""

    def __init__(self, root: Path, info: dict, dtype: str, scored: bool):
        self.root, self.dtype, self.has_scored = Path(root), np.dtype(dtype), scored
        self.shards = list(info["shards"])
        counts = np.array([s["tokens"] for s in self.shards], dtype=np.int64)
        self.base = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        starts = [np.fromfile(self.root / (s["name"] + ".docs"), dtype=np.int64)[:-1] + self.base[i]
                  for i, s in enumerate(self.shards)]
        self.doc_starts = np.concatenate([*starts, [self.base[-1]]]).astype(np.int64)
        self._maps: list | None = None

    @property
    def tokens_total(self) -> int:
        return int(self.base[-1])

    @property
    def documents(self) -> int:
        return len(self.doc_starts) - 1

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_maps"] = None  # mapped again where it is unpickled
        return state

    def _mapped(self) -> list:
        if self._maps is None:
            self._maps = []
            for shard in self.shards:
                path = self.root / (shard["name"] + ".tokens")
                tokens = np.memmap(path, dtype=self.dtype, mode="r") if shard["tokens"] else np.empty(0, self.dtype)
                scored = None
                if self.has_scored:
                    flags = self.root / (shard["name"] + ".scored")
                    scored = np.memmap(flags, dtype=np.uint8, mode="r") if shard["tokens"] else np.empty(0, np.uint8)
                self._maps.append((tokens, scored))
        return self._maps

    def _slice(self, start: int, end: int, which: int) -> np.ndarray:
        """Global positions [start, end) of the tokens (which=0) or scored flags (1), across shards."""
        maps = self._mapped()
        first = int(np.searchsorted(self.base, start, side="right")) - 1
        pieces, at = [], start
        shard = first
        while at < end and shard < len(maps):
            lo, hi = at - self.base[shard], min(end, self.base[shard + 1]) - self.base[shard]
            pieces.append(np.asarray(maps[shard][which][lo:hi]))
            at = int(self.base[shard]) + int(hi)
            shard += 1
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def tokens(self, start: int, end: int) -> torch.Tensor:
        return torch.from_numpy(self._slice(start, end, 0).astype(np.int64))

    def scored(self, start: int, end: int) -> torch.Tensor:
        return torch.from_numpy(self._slice(start, end, 1).astype(np.bool_))

    def flags(self, start: int, end: int) -> np.ndarray:
        """The tokens' flags as stored (uint8), for kinds that keep more than scored or not."""
        return self._slice(start, end, 1)

    def document(self, i: int) -> tuple[int, int]:
        return int(self.doc_starts[i]), int(self.doc_starts[i + 1])


class PackedTokens(Dataset):
    """Language-model blocks: the split's documents end to end (each ended by the end-of-text
    token where the tokenizer has one), cut into blocks of `block_size` tokens; the last partial
    block is left out. Sample i is tokens [i * block_size, (i + 1) * block_size)."""

    def __init__(self, split: StoreSplit, block_size: int):
        self.split, self.block_size = split, block_size

    def __len__(self) -> int:
        return self.split.tokens_total // self.block_size

    def __getitem__(self, i: int):
        if not 0 <= i < len(self):
            raise IndexError(i)
        start = int(i) * self.block_size
        return {"input_ids": self.split.tokens(start, start + self.block_size)}


class Documents(Dataset):
    """One document a sample, cut to `block_size` tokens (padded per batch by the loader's collate);
    with scored flags (chat data) its labels too: the token where scored, -100 elsewhere."""

    def __init__(self, split: StoreSplit, block_size: int):
        self.split, self.block_size = split, block_size

    def __len__(self) -> int:
        return self.split.documents

    def __getitem__(self, i: int):
        start, end = self.split.document(int(i))
        end = min(end, start + self.block_size)
        ids = self.split.tokens(start, end)
        if not self.split.has_scored:
            return {"input_ids": ids}
        return {"input_ids": ids, "labels": torch.where(self.split.scored(start, end), ids, IGNORE_INDEX)}


class PackedDocuments(Dataset):
    """Whole documents (conversations) packed into rows of exactly `block_size` tokens, in order,
    a row closed when the next would not fit; position_ids start at 0 for each document, so a
    model kept them apart; the rest of a row is padding (pad_id, labels -100). The packing is
    computed from the document lengths when opened (8 bytes a row)."""

    def __init__(self, split: StoreSplit, block_size: int, pad_id: int):
        self.split, self.block_size, self.pad_id = split, block_size, pad_id
        lengths = np.minimum(np.diff(split.doc_starts), block_size)
        rows, used = [0], 0
        for doc, length in enumerate(lengths.tolist()):
            if used and used + length > block_size:
                rows.append(doc)
                used = 0
            used += length
        rows.append(len(lengths))
        self.rows = np.array(rows if len(lengths) else [0], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.rows) - 1

    def __getitem__(self, i: int):
        ids = torch.full((self.block_size,), self.pad_id, dtype=torch.long)
        labels = torch.full((self.block_size,), IGNORE_INDEX, dtype=torch.long)
        positions = torch.arange(self.block_size)
        at = 0
        for doc in range(int(self.rows[i]), int(self.rows[i + 1])):
            start, end = self.split.document(doc)
            end = min(end, start + self.block_size)
            n = end - start
            piece = self.split.tokens(start, end)
            ids[at:at + n] = piece
            if self.split.has_scored:
                labels[at:at + n] = torch.where(self.split.scored(start, end), piece, IGNORE_INDEX)
            else:
                labels[at:at + n] = piece
            positions[at:at + n] = torch.arange(n)
            at += n
        positions[at:] = torch.arange(self.block_size - at)
        return {"input_ids": ids, "labels": labels, "position_ids": positions}


def open_split(root: Path, name: str) -> StoreSplit | None:
    """A split of the store at `root` (None where the store has no such split)."""
    manifest = read_manifest(root)
    info = (manifest or {}).get("splits", {}).get(name)
    if info is None:
        return None
    return StoreSplit(root, info, manifest["dtype"], manifest["kind"] in FLAGGED_KINDS)


def shared_documents(split: StoreSplit, other: StoreSplit) -> int:
    """How many of `split`'s documents are also documents of `other` (the same tokens, wherever
    they came from: a copied file, rows taken from another). Only documents of a length that
    `split` has are read from `other`, so a large training split costs its offsets and little else."""
    def digest(view: StoreSplit, i: int) -> bytes:
        start, end = view.document(i)
        return hashlib.blake2b(view._slice(start, end, 0).tobytes(), digest_size=16).digest()

    lengths = np.diff(split.doc_starts)
    wanted = set(lengths.tolist())
    seen = {digest(other, i) for i, length in enumerate(np.diff(other.doc_starts).tolist()) if length in wanted}
    return sum(digest(split, i) in seen for i in range(split.documents))


def directory_size(root: Path) -> int:
    return sum(f.stat().st_size for f in Path(root).iterdir() if f.is_file()) if os.path.isdir(root) else 0
