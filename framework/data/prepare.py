"""Tokenise a corpus once into a store every rank memory-maps (framework/data/store.py).

The files are cut into units (whole files, or byte ranges of large line-based files:
framework/data/sources.py) that worker processes read, tokenise and write as shards, each split
(train, validation, test) to its own; a unit's shards depend on the unit alone, so the store is the
same whatever the number of processes. A document goes to a split by a hash of its own content
(never its row number): growing a corpus never moves validation into training, and the split is the
same at every world size. The manifest records the files' sizes and modification times, the
tokenizer's content hash and every setting that changes the tokens (not data.num_proc): an
unchanged corpus is reused at once, a changed one is prepared again, and says why.

Preparation holds the store folder's lock (framework/data/once.py), so processes (or nodes)
sharing a cache folder prepare once; it writes to a temporary folder renamed into place when complete, removed on any failure
(a full disk included: the store prepared before, if any, is kept). Progress, with an ETA, is said
every few seconds.
"""
from __future__ import annotations

import errno
import hashlib
import json
import multiprocessing
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from framework.console import human_bytes
from framework.data.once import folder_lock
from framework.data.sources import Unit, plan_units, read_rows, row_place
from framework.data.splits import FILE_ROLES, SPLITS, SplitRule
from framework.data.store import FLAGGED_KINDS, MANIFEST, VERSION, fingerprint, read_manifest
from framework.errors import ConfigError, StorageError

PROGRESS_EVERY_S = 5.0


CACHE_VARIABLE = "FRAMEWORK_DATA_CACHE"


def default_cache_root() -> Path:
    """Where prepared data goes when data.cache_dir is null: $FRAMEWORK_DATA_CACHE, else
    ~/.cache/framework/data ($XDG_CACHE_HOME respected)."""
    if os.environ.get(CACHE_VARIABLE):
        return Path(os.environ[CACHE_VARIABLE])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "framework" / "data"


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class Encoded:
    """One document as a unit worker hands it on: its tokens, its scored flags (chat data), and
    the bytes whose hash chooses its split."""

    key: bytes
    tokens: np.ndarray
    scored: np.ndarray | None = None


class Missing:
    """What an encoder returns for a row without the field the settings name (counted, reported)."""


MISSING = Missing()
BATCH_ROWS = 256  # rows an encoder tokenises together (a fast tokenizer's batch)


@dataclass
class StoreSpec:
    """What a store is made of. `encoder(path, rows)` turns a batch of a file's rows into Encoded
    documents (MISSING for a row without the field, None for one that makes no document); it is
    pickled to the worker processes."""

    kind: str  # "text", "chat" or "preference" (the last two: a flag per token, store.FLAGGED_KINDS)
    roles: dict[str, list[str]]  # "files", "val_files", "test_files": absolute paths
    patterns: dict  # the roles as given (globs, folders): the store's identity, so a grown corpus replaces it
    tokenizer: str  # the tokenizer as given (its path): with another path, another store
    format: str
    settings: dict  # every setting that changes the tokens (not num_proc)
    tokenizer_sha256: str
    dtype: str
    encoder: Callable
    cache_root: Path
    num_proc: int | None = 1  # None: framework/data/prepare.py default_processes
    text_unit: str = "document"
    separator: str | None = None
    val_percent: int = 0
    test_percent: int = 0
    missing: str = "data.text_field: {count} row(s) have no such field (the first: {where})"
    """What to say of rows the encoder found without what it reads ({count}, {where} filled in)."""

    @property
    def split_rule(self) -> SplitRule:
        return SplitRule(self.val_percent, self.test_percent, bool(self.roles.get("val_files")),
                         bool(self.roles.get("test_files")))

    @property
    def files(self) -> list[str]:
        return [f for role in FILE_ROLES for f in self.roles.get(role) or []]

    def role_of(self, index: int) -> str:
        """The role of files[index] (a file named in two roles is read once for each)."""
        for role in FILE_ROLES:
            count = len(self.roles.get(role) or [])
            if index < count:
                return role
            index -= count
        raise IndexError(index)

    def key(self) -> str:
        """The store's folder name: what the data is meant to be (the patterns, the tokenizer's path,
        the settings), not what the files and the tokenizer hold now: a changed corpus or tokenizer
        file prepares the same folder again (why_stale says why), rather than leaving the old copy."""
        identity = {"version": VERSION, "kind": self.kind, "patterns": self.patterns, "format": self.format,
                    "settings": self.settings, "tokenizer": self.tokenizer, "dtype": self.dtype,
                    "split": [self.val_percent, self.test_percent]}
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]

    def directory(self) -> Path:
        return Path(self.cache_root) / f"{self.kind}-{self.key()}"

    def file_stats(self) -> list[list]:
        return [[path, stat.st_size, stat.st_mtime_ns] for path, stat in ((p, os.stat(p)) for p in self.files)]


# ---- a unit's work (in a worker process) ---------------------------------------------------

@dataclass
class UnitResult:
    unit: int
    counts: dict = field(default_factory=dict)  # split -> [tokens, documents]
    missing: int = 0
    first_missing: tuple | None = None  # (path, position)
    smallest: tuple | None = None  # (hash, document index) of the unit's train document with the smallest hash
    nbytes: int = 0
    pid: int = field(default_factory=os.getpid)  # the process that prepared it


class _ShardWriter:
    """A unit's shard of one split: tokens (and scored flags), and its documents' starts."""

    def __init__(self, path: Path, dtype: str, scored: bool):
        self.path, self.dtype = path, np.dtype(dtype)
        self.tokens = open(str(path) + ".tokens", "wb")
        self.scored = open(str(path) + ".scored", "wb") if scored else None
        self.starts = [0]
        self.buffer: list[np.ndarray] = []
        self.flags: list[np.ndarray] = []
        self.buffered = 0

    def add(self, doc: Encoded) -> None:
        self.buffer.append(doc.tokens.astype(self.dtype, copy=False))
        if self.scored is not None:
            self.flags.append(doc.scored.astype(np.uint8, copy=False))
        self.starts.append(self.starts[-1] + len(doc.tokens))
        self.buffered += len(doc.tokens)
        if self.buffered >= 1 << 22:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            self.tokens.write(memoryview(np.concatenate(self.buffer)))
            if self.scored is not None:
                self.scored.write(memoryview(np.concatenate(self.flags)))
        self.buffer, self.flags, self.buffered = [], [], 0

    def close(self) -> int:
        self.flush()
        self.tokens.close()
        if self.scored is not None:
            self.scored.close()
        write_array(str(self.path) + ".docs", np.array(self.starts, dtype=np.int64))
        return len(self.starts) - 1


def write_array(path: str, array: np.ndarray) -> None:
    """`array`'s bytes to `path` (a full disk raises OSError ENOSPC, which numpy's tofile does not)."""
    with open(path, "wb") as f:
        f.write(memoryview(np.ascontiguousarray(array)))


_SPEC: StoreSpec | None = None  # a worker process's spec, given once when it starts


def _init_worker(spec: StoreSpec) -> None:
    global _SPEC
    _SPEC = spec
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process a core already: no second pool of threads


def _batches(rows: Iterator[tuple[int, object]], size: int) -> Iterator[list]:
    batch = []
    for item in rows:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def unit_documents(spec: StoreSpec, unit: Unit) -> Iterator[tuple[str | None, object, int, int]]:
    """A unit's documents in file order, each as (split, document, digest, position): the split
    by the files' role or by a hash of the document (the one rule of the store and the stream);
    a row without the field the settings name as (None, MISSING, 0, its position)."""
    path = spec.files[unit.file]
    forced, rule = FILE_ROLES[spec.role_of(unit.file)], spec.split_rule
    rows = read_rows(path, spec.format, unit, spec.text_unit, spec.separator)
    for batch in _batches(rows, BATCH_ROWS):
        for (position, _), doc in zip(batch, spec.encoder(path, [row for _, row in batch])):
            if doc is MISSING:
                yield None, MISSING, 0, position
            elif doc is not None and len(doc.tokens):
                split, digest = (forced, 0) if forced else rule.split_of(doc.key)
                yield split, doc, digest, position


def run_unit(job: tuple) -> UnitResult:
    """Read, tokenise and write one unit: its documents into the shards of their splits."""
    index, unit, out = job
    spec = _SPEC
    path = spec.files[unit.file]
    result = UnitResult(index)
    writers = {name: _ShardWriter(Path(out) / f"u{index:06d}-{name}", spec.dtype, spec.kind in FLAGGED_KINDS)
               for name in SPLITS}
    for split, doc, digest, position in unit_documents(spec, unit):
        if doc is MISSING:
            result.missing += 1
            result.first_missing = result.first_missing or (path, position)
            continue
        if split == "train" and (result.smallest is None or digest < result.smallest[0]):
            result.smallest = (digest, len(writers["train"].starts) - 1)
        writers[split].add(doc)
    for name, writer in writers.items():
        documents = writer.close()
        result.counts[name] = [writer.starts[-1], documents]
    result.nbytes = (unit.end if unit.end is not None else os.path.getsize(path)) - unit.start
    return result


# ---- preparing a store (once: framework/data/once.py) -------------------------------------

def why_stale(manifest: dict | None, spec: StoreSpec) -> str | None:
    """Why a store found in the cache cannot be used (None: it can)."""
    if manifest is None:
        return "no prepared data yet"
    if manifest.get("tokenizer_sha256") != spec.tokenizer_sha256:
        return "the tokenizer changed (its file's contents), so the token ids did"
    old = {path: (size, mtime) for path, size, mtime in manifest.get("files", [])}
    new = {path: (size, mtime) for path, size, mtime in spec.file_stats()}
    added, removed = sorted(set(new) - set(old)), sorted(set(old) - set(new))
    changed = sorted(p for p in set(new) & set(old) if new[p] != old[p])
    if added or removed or changed:
        parts = [f"{len(v)} file(s) {k} ({Path(v[0]).name}{', ...' if len(v) > 1 else ''})"
                 for k, v in (("added", added), ("removed", removed), ("changed", changed)) if v]
        return "the corpus changed since it was prepared: " + "; ".join(parts)
    return None


def prepare(spec: StoreSpec, say: Callable[[str], None]) -> Path:
    """The store of `spec`, ready: reused when the cache holds it unchanged, else prepared (the
    stale one replaced). Errors are ConfigError (a row that does not read, a missing field) or
    StorageError (the disk filled); either way nothing partial is left."""
    directory = spec.directory()
    with folder_lock(directory, say):
        reason = why_stale(read_manifest(directory), spec)
        if reason is None:
            return directory
        if reason != "no prepared data yet":
            say(f"data: preparing again: {reason}")
        partial = directory.with_name(f"{directory.name}.partial-{socket.gethostname()}-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        try:
            partial.mkdir(parents=True)
            _prepare_into(spec, partial, say)
            old = directory.with_name(f"{directory.name}.old-{os.getpid()}")
            if directory.exists():
                directory.rename(old)
            partial.rename(directory)
            shutil.rmtree(old, ignore_errors=True)
        except OSError as err:
            shutil.rmtree(partial, ignore_errors=True)
            if err.errno == errno.ENOSPC:
                free = shutil.disk_usage(directory.parent).free
                raise StorageError(f"the disk filled while preparing the data in {directory.parent} ({human_bytes(free)} "
                                   "free now): the partial shards were removed, data prepared before (if any) is kept. "
                                   "Free space or set data.cache_dir to a larger disk (the store needs 1 byte a token "
                                   "for bytes, 2 with a vocabulary up to 65,536, 4 beyond).") from err
            raise
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    return directory


#: with less than this in files, `data.num_proc: null` prepares in the run's own process: a pool's
#: processes are fresh interpreters (each imports torch and the tokenizer; `import torch` alone
#: takes 2 s on the 2-core machine) that cost more than the work they would share
POOL_FROM_BYTES = 4 * 2**20


def default_processes(total_bytes: int) -> int:
    """`data.num_proc: null`: one process per core, or this process alone for small files."""
    return 1 if total_bytes < POOL_FROM_BYTES else os.cpu_count() or 1


def _prepare_into(spec: StoreSpec, out: Path, say: Callable[[str], None]) -> None:
    started = time.time()
    units = plan_units(spec.files, spec.format, spec.text_unit, spec.separator)
    total = sum(os.path.getsize(f) for f in spec.files)
    jobs = [(i, unit, str(out)) for i, unit in enumerate(units)]
    processes = max(1, min(spec.num_proc or default_processes(total), len(units)))
    say(f"data: preparing {len(spec.files)} file(s), {human_bytes(total)}, in {len(units)} unit(s) with {processes} "
        f"process(es) into {out.parent}")
    results: list[UnitResult] = []
    done_bytes, last_said = 0, time.time()
    context = multiprocessing.get_context("spawn") if processes > 1 else None
    pool = context.Pool(processes, initializer=_init_worker, initargs=(spec,)) if context else None
    if pool is None:
        _init_worker(spec)
    try:
        for result in (pool.imap(run_unit, jobs) if pool else map(run_unit, jobs)):
            results.append(result)
            done_bytes += result.nbytes
            now = time.time()
            if now - last_said >= PROGRESS_EVERY_S and done_bytes < total:
                rate = done_bytes / max(now - started, 1e-9)
                say(f"data: {100 * done_bytes / max(total, 1):.0f}% ({human_bytes(done_bytes)} of {human_bytes(total)}), "
                    f"{human_bytes(rate)}/s, about {(total - done_bytes) / max(rate, 1):.0f} s left")
                last_said = now
    finally:
        if pool:
            pool.terminate()
            pool.join()
    missing = sum(r.missing for r in results)
    if missing:
        path, position = next(r.first_missing for r in results if r.first_missing)
        where = f"{path}, {row_place(path, spec.format, position)}"
        raise ConfigError(spec.missing.format(count=f"{missing:,}", where=where))
    _hold_out_one_if_empty(spec, results, out)
    splits, summary = {}, {}
    for name in SPLITS:
        shards = [{"name": f"u{r.unit:06d}-{name}", "tokens": r.counts[name][0], "documents": r.counts[name][1]}
                  for r in results if r.counts[name][1]]
        for r in results:  # empty shards are not kept
            if not r.counts[name][1]:
                for suffix in (".tokens", ".docs", ".scored"):
                    (out / f"u{r.unit:06d}-{name}{suffix}").unlink(missing_ok=True)
        if shards or name != "test" or _wants_test(spec):
            splits[name] = {"shards": shards}
            summary[name] = [sum(s["tokens"] for s in shards), sum(s["documents"] for s in shards)]
    manifest = {"version": VERSION, "kind": spec.kind, "files": spec.file_stats(), "format": spec.format,
                "settings": spec.settings, "tokenizer_sha256": spec.tokenizer_sha256, "dtype": spec.dtype,
                "splits": splits, "splits_summary": summary, "seconds": round(time.time() - started, 2),
                "units": len(units), "processes": processes}
    manifest["fingerprint"] = fingerprint(manifest)
    (out / (MANIFEST + ".tmp")).write_text(json.dumps(manifest, indent=1))
    (out / (MANIFEST + ".tmp")).replace(out / MANIFEST)
    tokens = sum(v[0] for v in summary.values())
    say(f"data: prepared {tokens:,} tokens in {manifest['seconds']:.1f} s ("
        + ", ".join(f"{k} {v[1]:,} documents" for k, v in summary.items()) + ")")


def _wants_test(spec: StoreSpec) -> bool:
    return bool(spec.roles.get("test_files")) or spec.test_percent > 0


def _hold_out_one_if_empty(spec: StoreSpec, results: list[UnitResult], out: Path) -> None:
    """A corpus too small for its percentages still holds out one document for each split it needs:
    the training document with the smallest hash moves to the empty split (val first, then test)."""
    needs = []
    if not spec.roles.get("val_files") and spec.val_percent:
        needs.append("val")
    if not spec.roles.get("test_files") and spec.test_percent:
        needs.append("test")
    for name in needs:
        if any(r.counts[name][1] for r in results):
            continue
        if sum(r.counts["train"][1] for r in results) < 2:  # one document: nothing to train on if it moved
            continue
        candidates = [r for r in results if r.smallest is not None]
        donor = min(candidates, key=lambda r: r.smallest[0])
        _move_document(out, donor, donor.smallest[1], name, spec)
        donor.smallest = None


def _move_document(out: Path, result: UnitResult, doc: int, split: str, spec: StoreSpec) -> None:
    """Move document `doc` of a unit's train shard into its (empty) `split` shard."""
    dtype = np.dtype(spec.dtype)
    train, target = out / f"u{result.unit:06d}-train", out / f"u{result.unit:06d}-{split}"
    starts = np.fromfile(str(train) + ".docs", dtype=np.int64)
    lo, hi = int(starts[doc]), int(starts[doc + 1])
    suffixes = [(".tokens", dtype)] + ([(".scored", np.uint8)] if spec.kind in FLAGGED_KINDS else [])
    for suffix, kind in suffixes:
        values = np.fromfile(str(train) + suffix, dtype=kind)
        write_array(str(target) + suffix, values[lo:hi])
        write_array(str(train) + suffix, np.concatenate([values[:lo], values[hi:]]))
    write_array(str(target) + ".docs", np.array([0, hi - lo], dtype=np.int64))
    write_array(str(train) + ".docs", np.concatenate([starts[:doc + 1], starts[doc + 2:] - (hi - lo)]))
    result.counts[split] = [hi - lo, 1]
    result.counts["train"] = [result.counts["train"][0] - (hi - lo), result.counts["train"][1] - 1]
