"""One checkpoint = one directory:
    checkpoints/step_000100/
        model.pt            model state by parameter name (rank zero)
        optimizer.pt        optimizer state (rank zero)
      or, with checkpoint_io=dcp (meta.json says "layout": "sharded"):
        state/              one torch.distributed.checkpoint directory holding {"model", "optimizer"},
                            each rank's shards in its own file (framework.checkpoint_io.dcp_reader)
        loop_rank<r>.pt     per rank: loop counters, RNG states, dataloader position, scheduler,
                            precision (loss scaler) and callback state
        meta.json           written last: step, epoch, world size, plugins, versions, config,
                            metrics, and the size of every file (to detect truncation)

Files are written into `.partial-step_000100/` and the directory is renamed into place once
meta.json is down, so a crash at any moment leaves earlier checkpoints untouched and never
leaves a directory that looks complete but is not.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from framework.checkpoint.storage import disk_full_error, free_bytes, is_disk_full
from framework.checkpoint_io.dcp_reader import STATE_DIR
from framework.errors import CheckpointError
from framework.version import versions

FORMAT_VERSION = 1
META = "meta.json"
PARTIAL_PREFIX = ".partial-"
FULL, SHARDED = "full", "sharded"


def checkpoint_name(step: int) -> str:
    return f"step_{step:06d}"


@dataclass
class CheckpointInfo:
    path: Path
    meta: dict

    @property
    def step(self) -> int:
        return int(self.meta["step"])


@dataclass
class PendingCheckpoint:
    """Files handed to the CheckpointIO; complete once `finalize_checkpoint` has run."""

    partial: Path
    final: Path
    step: int
    meta: dict


def begin_checkpoint(strategy, root: Path, step: int, shared: dict[str, Any], per_rank: dict[str, Any],
                     meta: dict, sharded: dict[str, Any] | None = None) -> PendingCheckpoint:
    """Collective: every rank calls it. Hands `shared` (name -> object, rank zero), `per_rank`
    (each rank, as `<name>_rank<r>.pt`) and `sharded` (each rank's part, into one DCP directory
    `state/`) to the CheckpointIO, which may still be writing when this returns (an asynchronous
    one); the checkpoint is not visible until it is finalized."""
    io = strategy.checkpoint_io
    final = root / checkpoint_name(step)
    partial = root / f"{PARTIAL_PREFIX}{final.name}"
    pending = PendingCheckpoint(partial, final, step, {"layout": SHARDED if sharded is not None else FULL, **meta})
    failure = None
    try:
        if strategy.is_global_zero:
            if partial.exists():
                shutil.rmtree(partial)
            partial.mkdir(parents=True)
    except OSError as err:
        failure = err
    _stop_together_on_failure(strategy, pending, failure)  # doubles as the barrier before the writes
    try:
        if sharded is not None:
            io.save_sharded(sharded, partial / STATE_DIR)
        for name, obj in per_rank.items():
            io.save(obj, partial / f"{name}_rank{strategy.global_rank}.pt")
        if strategy.is_global_zero:
            for name, obj in shared.items():
                io.save(obj, partial / f"{name}.pt")
    except Exception as err:
        failure = err
    _stop_together_on_failure(strategy, pending, failure)
    return pending


def _stop_together_on_failure(strategy, pending: PendingCheckpoint, failure: BaseException | None) -> None:
    """Collective: whether any rank's write failed. If one did, every rank stops here (none is left
    waiting at the next barrier), the partial directory is removed so it holds no space, and the
    complete checkpoints are untouched. A full disk gets its own message (framework/checkpoint/storage.py)."""
    if not strategy.any_rank(failure is not None):
        return
    strategy.checkpoint_io.discard()
    free = free_bytes(pending.final.parent)  # before the partial checkpoint gives its space back
    strategy.barrier()
    if strategy.is_global_zero:
        shutil.rmtree(pending.partial, ignore_errors=True)
    strategy.barrier()
    name, root = pending.final.name, pending.final.parent
    # every rank names the full disk, whichever rank's write met it (rank zero's error is the one shown)
    if strategy.any_rank(failure is not None and is_disk_full(failure)):
        complete, _ = list_checkpoints(root)
        raise disk_full_error(root, name, complete[-1].path if complete else None, free) from failure
    if failure is None:
        failure = CheckpointError(f"writing checkpoint {name} failed on another process (its message says why); the "
                                  "partial checkpoint was removed and the complete ones are kept.")
    if isinstance(failure, Exception) and not isinstance(failure, CheckpointError):
        raise CheckpointError(f"writing checkpoint {name} to {root} failed: {type(failure).__name__}: {failure}. "
                              "The partial checkpoint was removed and the complete ones are kept.") from failure
    raise failure


def finalize_checkpoint(strategy, pending: PendingCheckpoint) -> Path:
    """Collective: wait for every rank's writes, then write meta.json (with every file's size)
    and rename the directory into place. Returns the final directory."""
    failure = None
    try:
        strategy.checkpoint_io.wait()
    except Exception as err:  # a background writer's error, raised here on the rank that had it
        failure = err
    _stop_together_on_failure(strategy, pending, failure)  # doubles as the barrier after the writes
    partial, final = pending.partial, pending.final
    if strategy.is_global_zero:
        files = {p.relative_to(partial).as_posix(): p.stat().st_size for p in sorted(partial.rglob("*")) if p.is_file()}
        meta = {"format_version": FORMAT_VERSION, "step": pending.step, "world_size": strategy.world_size,
                "data_parallel_size": strategy.data_parallel.size,
                "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "versions": versions(), **pending.meta,
                "files": files}
        tmp = partial / f".{META}.tmp"
        tmp.write_text(json.dumps(meta, indent=2, default=str))
        os.replace(tmp, partial / META)
        if final.exists():  # the same step saved again (e.g. after a resume): replace it whole
            trash = final.parent / f"{PARTIAL_PREFIX}old-{final.name}"
            os.replace(final, trash)
            os.replace(partial, final)
            shutil.rmtree(trash)
        else:
            os.replace(partial, final)
    strategy.barrier()
    return final


def read_meta(path: Path) -> dict:
    meta_path = path / META
    if not path.is_dir():
        raise CheckpointError(f"ckpt_path={path}: no such checkpoint directory.")
    if not meta_path.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint: {META} is missing (the write was "
                              "interrupted, or this is not a checkpoint directory). Use an earlier checkpoint.")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{meta_path} is corrupt ({err}).") from err
    for key in ("format_version", "step", "files"):
        if key not in meta:
            raise CheckpointError(f"{meta_path} lacks '{key}': not a checkpoint of this framework.")
    if meta["format_version"] > FORMAT_VERSION:
        raise CheckpointError(f"{path} was written by a newer format (version {meta['format_version']}); "
                              "upgrade the framework to load it.")
    return meta


def check_files(path: Path, meta: dict, names: list[str]) -> None:
    for name in names:
        file = path / name
        if name not in meta["files"]:
            raise CheckpointError(f"{path} has no {name} (it holds: {', '.join(meta['files'])}).")
        if not file.is_file():
            raise CheckpointError(f"{file} is missing; the checkpoint is incomplete.")
        expected, actual = meta["files"][name], file.stat().st_size
        if actual != expected:
            raise CheckpointError(f"{file} is truncated or corrupt: {actual} bytes on disk, "
                                  f"{expected} bytes when it was written. Use an earlier checkpoint.")


def load_checkpoint_files(io, path: Path, rank: int) -> tuple[dict, dict[str, Any]]:
    """(meta, {name: object}) for the shared files and this rank's loop state. A rank the
    checkpoint has no loop state for (it was written by fewer processes) gets rank zero's; the
    loop then translates the data position (see FitLoop.restore)."""
    meta = read_meta(path)
    shared = [n for n in meta["files"] if n.endswith(".pt") and "_rank" not in n and "/" not in n]
    if meta.get("weights_only"):  # imported weights (framework convert --from deepspeed)
        check_files(path, meta, ["model.pt"])
        return meta, {"model": io.load(path / "model.pt")}
    mine = f"loop_rank{rank}.pt"
    if mine not in meta["files"]:
        mine = "loop_rank0.pt"
    check_files(path, meta, shared + [mine] + sharded_files(meta))
    objects = {n[:-3]: io.load(path / n) for n in shared}
    objects["loop"] = io.load(path / mine)
    return meta, objects


def is_sharded(meta: dict) -> bool:
    return meta.get("layout", FULL) == SHARDED


def sharded_files(meta: dict) -> list[str]:
    """The files of the DCP directory of a sharded checkpoint (none for the full layout)."""
    if not is_sharded(meta):
        return []

    return [n for n in meta["files"] if n.startswith(f"{STATE_DIR}/")]


def list_checkpoints(root: Path) -> tuple[list[CheckpointInfo], list[Path]]:
    """(complete checkpoints sorted by step, incomplete directories)."""
    complete, partial = [], []
    if not root.is_dir():
        return complete, partial
    for child in sorted(root.iterdir()):
        if not child.is_dir():
            continue
        if child.name.startswith(PARTIAL_PREFIX):
            partial.append(child)
            continue
        try:
            complete.append(CheckpointInfo(child, read_meta(child)))
        except CheckpointError:
            partial.append(child)
    return sorted(complete, key=lambda c: c.step), partial


def is_finite(meta: dict) -> bool:
    """Whether a checkpoint's weights were finite when saved (older checkpoints: assumed so)."""
    return bool(meta.get("finite", True))


def newest_finite(root: Path) -> Path | None:
    """The newest complete checkpoint under `root` whose weights were finite, or None."""
    complete, _ = list_checkpoints(root)
    finite = [c for c in complete if is_finite(c.meta)]
    return finite[-1].path if finite else None
