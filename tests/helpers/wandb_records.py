"""Reads an offline W&B run back: its transaction log (`run-<id>.wandb`) decoded with wandb's own
protobuf schema. The log is LevelDB's record format behind a 7-byte header: 32 KiB blocks of
records, each a 7-byte header (CRC, length, type: full, first, middle, last) and its bytes."""
from __future__ import annotations

import json
import struct
import time
from pathlib import Path

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path):
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    offset, pending = HEADER, b""
    while offset + HEADER <= len(data):
        room = BLOCK - offset % BLOCK
        if room < HEADER:  # a block's tail too short for a header is padding
            offset += room
            continue
        _, length, kind = struct.unpack("<IHB", data[offset:offset + HEADER])
        chunk = data[offset + HEADER:offset + HEADER + length]
        offset += HEADER + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def offline_run(run_dir: Path) -> dict:
    """{"config": {...}, "history": [{key: value, "_step": step}], "summary": {...}} of the one
    offline W&B run under `run_dir`."""
    (log,) = Path(run_dir).glob("wandb/offline-run-*/run-*.wandb")
    # wandb's service process may still be writing the log when run.finish() has returned (in one
    # test-fast run of eight its `run` record was not there yet): read it once its `exit` record is
    deadline = time.monotonic() + 60
    while not any(r.WhichOneof("record_type") == "exit" for r in _readable(log)) and time.monotonic() < deadline:
        time.sleep(0.1)
    run = {"config": {}, "history": [], "summary": {}, "name": None}
    for record in records(log):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run["name"] = record.run.display_name
            run["config"].update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            run["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            run["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            run["summary"].update({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                   for i in record.summary.update})
    return run


def _readable(log: Path):
    """The records of a log still being written, up to the first one not yet whole."""
    try:
        yield from records(log)
    except Exception:  # a record cut short by the writer: not there yet
        return
