"""Documents out of files, streamed: plain text (a document per file, per paragraph, per line, or
split on a separator), JSON lines, JSON arrays (pretty-printed or not), parquet and CSV, each
optionally compressed (.gz; .zst with the zstandard package), from globs or folders.

Nothing here holds a corpus in memory: a file is read row by row (a JSON array is the exception:
it is parsed whole, as JSON gives no other way; JSON lines suit large corpora). Line-based files
are cut into byte ranges that start and end at a line (or, for paragraphs, a blank line), so that
several processes read one large file; every document keeps its place (file, byte offset) for the
messages that name it.
"""
from __future__ import annotations

import bz2
import csv
import glob
import gzip
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from framework.errors import ConfigError

# the reader of each suffix (after a compression suffix is taken off)
FORMATS = {".txt": "text", ".text": "text", ".md": "text", ".py": "text", ".rst": "text", ".jsonl": "jsonl",
           ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".bz2": "bzip2"}
TEXT_UNITS = ("document", "paragraph", "line")
RANGE_BYTES = 64 << 20  # line-based files are read in ranges of about this size, in parallel


def expand(patterns: str | list[str], key: str) -> list[str]:
    """Every file the glob patterns (or folders: every file below them) match, sorted, absolute;
    a pattern matching nothing is refused, named."""
    files = []
    for pattern in [patterns] if isinstance(patterns, str) else list(patterns):
        path = os.path.expanduser(str(pattern))
        if os.path.isdir(path):
            matched = sorted(str(p) for p in Path(path).rglob("*") if p.is_file() and not p.name.startswith("."))
        else:
            matched = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))
        if not matched:
            raise ConfigError(f"{key}: the pattern {str(pattern)!r} matches no file (relative patterns are read from "
                              f"{os.getcwd()}).")
        files += [os.path.abspath(p) for p in matched]
    return list(dict.fromkeys(files))


def split_suffix(path: str) -> tuple[str, str | None]:
    """(the format's suffix, the compression or None): 'a.jsonl.gz' -> ('.jsonl', 'gzip')."""
    name = Path(path).name.lower()
    compression = next((c for s, c in COMPRESSIONS.items() if name.endswith(s)), None)
    if compression:
        name = name[: name.rfind(".")]
    return Path(name).suffix, compression


def file_format(files: list[str], given: str | None, key: str) -> str:
    """One format for all `files`: `given`, or the one their suffixes name."""
    known = sorted(set(FORMATS.values()))
    if given:
        given = {"json_lines": "jsonl"}.get(given, given)
        if given not in known:
            raise ConfigError(f"data.format={given!r}: choose one of {', '.join(known)}, or null to tell it from the "
                              "file suffixes.")
        return given
    found = {FORMATS.get(split_suffix(f)[0]) for f in files}
    if None in found or len(found) != 1:
        suffixes = sorted({"".join(Path(f).suffixes) or "(none)" for f in files})
        raise ConfigError(f"{key}: cannot tell one format from the suffixes {', '.join(suffixes)}; set data.format "
                          f"to one of {', '.join(known)}.")
    return found.pop()


def open_binary(path: str):
    """The file's bytes, decompressed by its suffix."""
    compression = split_suffix(path)[1]
    if compression == "gzip":
        return gzip.open(path, "rb")
    if compression == "bzip2":
        return bz2.open(path, "rb")
    if compression == "zstd":
        try:
            import zstandard
        except ImportError:
            raise ConfigError(f"data.files: {path} is zstd-compressed, and the zstandard package is not installed: "
                              "`pip install zstandard` (or 'framework[data]'), or decompress it.") from None
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True))
    return open(path, "rb")


@dataclass(frozen=True)
class Unit:
    """A piece of work: `files[file]` from byte `start` to `end` (None: to its end), read by one
    process. Units of one file are consecutive and in order."""

    file: int
    start: int = 0
    end: int | None = None


def plan_units(files: list[str], fmt: str, text_unit: str, separator: str | None,
               target: int | None = None) -> list[Unit]:
    """The files cut into units: uncompressed line-based files in ranges of about `target` bytes
    (default RANGE_BYTES, read when called) ending at a line (a blank line for paragraphs);
    anything else whole."""
    target = RANGE_BYTES if target is None else target
    units = []
    splittable = fmt == "jsonl" or (fmt == "text" and text_unit in ("line", "paragraph") and not separator)
    for index, path in enumerate(files):
        size = os.path.getsize(path)
        if not splittable or split_suffix(path)[1] or size <= target:
            units.append(Unit(index))
            continue
        boundary = b"\n\n" if fmt == "text" and text_unit == "paragraph" else b"\n"
        starts = [0]
        with open(path, "rb") as f:
            while starts[-1] + target < size:
                f.seek(starts[-1] + target)
                window = f.read(1 << 20)
                found = window.find(boundary)
                while found < 0 and window:  # a very long line or paragraph: read on
                    more = f.read(1 << 20)
                    if not more:
                        break
                    window += more
                    found = window.find(boundary)
                if found < 0:
                    break
                starts.append(starts[-1] + target + found + len(boundary))
        units += [Unit(index, start, end) for start, end in zip(starts, [*starts[1:], None])]
    return units


class RowError(ConfigError):
    """A row that does not read: the file, the line (where it has one) and why."""


def _line_number(path: str, offset: int, within: int) -> int:
    """The 1-based line of the `within`-th line (0-based) after byte `offset` (counted only when a
    message needs it)."""
    if offset == 0:
        return within + 1
    with open(path, "rb") as f:
        before = f.read(offset).count(b"\n")
    return before + within + 1


def row_place(path: str, fmt: str, position: int) -> str:
    """Where a row read_rows yielded at `position` is, as a person finds it: the 1-based line of a
    JSON-lines or plain-text file (its byte offset counted in, decompressed), else the 1-based row
    (a JSON array's element, a parquet row, a CSV row after the header)."""
    if fmt not in ("jsonl", "text"):
        return f"row {position + 1}{' after the header' if fmt == 'csv' else ''}"
    lines, remaining = 1, position
    with open_binary(path) as raw:
        while remaining > 0:
            chunk = raw.read(min(remaining, 1 << 20))
            if not chunk:
                break
            lines += chunk.count(b"\n")
            remaining -= len(chunk)
    return f"line {lines}"


def _ranged_lines(path: str, unit: Unit) -> Iterator[bytes]:
    with open_binary(path) as raw:
        if unit.start:
            raw.seek(unit.start)
        if unit.end is None:
            yield from raw
            return
        remaining = unit.end - unit.start
        for line in raw:
            remaining -= len(line)
            yield line
            if remaining <= 0:
                return


def read_rows(path: str, fmt: str, unit: Unit = Unit(0), text_unit: str = "document",
              separator: str | None = None) -> Iterator[tuple[int, object]]:
    """(position in the file, row) for each row of `unit`: a str for plain text (a document,
    paragraph or line; empty ones skipped), a dict for the other formats. The position is the byte
    offset of a text row or line, the index of an array element, parquet or CSV row. Rows that do
    not read raise RowError naming file and line."""
    if fmt == "text":
        yield from _text_rows(path, unit, text_unit, separator)
    elif fmt == "jsonl":
        offset = unit.start
        for number, line in enumerate(_ranged_lines(path, unit)):
            at, offset = offset, offset + len(line)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, UnicodeDecodeError) as err:
                raise RowError(f"{path}, line {_line_number(path, unit.start, number)}: does not read as JSON "
                               f"({type(err).__name__}: {str(err).splitlines()[0]}).") from None
            if not isinstance(row, dict):
                raise RowError(f"{path}, line {_line_number(path, unit.start, number)}: a JSON {type(row).__name__}, "
                               "not an object with fields (each line of JSON lines is one row).")
            yield at, row
    elif fmt == "json":
        yield from enumerate(_json_array(path))
    elif fmt == "parquet":
        import pyarrow.parquet

        index = 0
        for batch in pyarrow.parquet.ParquetFile(path).iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                yield index, row
                index += 1
    elif fmt == "csv":
        with open_binary(path) as raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as text:
            try:
                for index, row in enumerate(csv.DictReader(text)):
                    yield index, row
            except (csv.Error, UnicodeDecodeError) as err:
                raise RowError(f"{path}: does not read as CSV ({type(err).__name__}: {err}).") from None


def _json_array(path: str) -> list:
    """A .json file's rows: an array of objects (a file of JSON lines named .json is read as such)."""
    with open_binary(path) as raw:
        data = raw.read()
    text = data.lstrip()
    if text[:1] != b"[":
        rows = []
        for number, line in enumerate(data.splitlines()):
            if line.strip():
                try:
                    row = json.loads(line)
                except (ValueError, UnicodeDecodeError) as err:
                    shape = ("a JSON object, not an array of rows or JSON lines" if text[:1] == b"{" and number == 0
                             else f"does not read as JSON ({type(err).__name__}: {str(err).splitlines()[0]})")
                    raise RowError(f"{path}, line {number + 1}: {shape}.") from None
                if not isinstance(row, dict):
                    raise RowError(f"{path}, line {number + 1}: a JSON {type(row).__name__}, not an object with fields.")
                rows.append(row)
        return rows
    try:
        rows = json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        line = getattr(err, "lineno", None)
        raise RowError(f"{path}{f', line {line}' if line else ''}: does not read as a JSON array "
                       f"({type(err).__name__}: {str(err).splitlines()[0]}).") from None
    bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
    if bad is not None:
        raise RowError(f"{path}: element {bad} of the array is a JSON {type(rows[bad]).__name__}, not an object with "
                       "fields (an array of rows, each an object).")
    return rows


def _text_rows(path: str, unit: Unit, text_unit: str, separator: str | None) -> Iterator[tuple[int, str]]:
    if text_unit == "document" or separator:
        with open_binary(path) as raw:
            data = raw.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise RowError(f"{path}: not UTF-8 text (byte {err.start}: {data[err.start:err.start + 1]!r}); plain-text "
                           "files must be UTF-8.") from None
        if not separator:
            if text.strip():
                yield 0, text
            return
        offset = 0
        for piece in text.split(separator):
            if piece.strip():
                yield offset, piece
            offset += len(piece) + len(separator)
        return
    offset = unit.start
    paragraph, paragraph_at = [], offset
    for number, line in enumerate(_ranged_lines(path, unit)):
        at, offset = offset, offset + len(line)
        try:
            decoded = line.decode("utf-8")
        except UnicodeDecodeError as err:
            raise RowError(f"{path}, line {_line_number(path, unit.start, number)}: not UTF-8 text (byte {err.start} "
                           "of the line); plain-text files must be UTF-8.") from None
        if text_unit == "line":
            if decoded.strip():
                yield at, decoded
            continue
        if decoded.strip():
            if not paragraph:
                paragraph_at = at
            paragraph.append(decoded)
        elif paragraph:
            yield paragraph_at, "".join(paragraph)
            paragraph = []
    if paragraph:
        yield paragraph_at, "".join(paragraph)
