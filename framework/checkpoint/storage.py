"""When storage fails under a checkpoint write: tell a full disk from other failures, and say in
one paragraph what it needs, what is free, what was kept and what to do."""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from framework.errors import StorageError

FULL = (errno.ENOSPC, errno.EDQUOT)
# torch.save's zip writer reports a short write (what a full disk causes) without the OSError
TORCH_SHORT_WRITE = ("unexpected pos", "file write failed", "No space left on device")


def is_disk_full(err: BaseException | None) -> bool:
    """Whether `err` (or anything in its cause chain) is a full disk or an exhausted quota."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in FULL:
            return True
        if any(text in str(err) for text in TORCH_SHORT_WRITE):
            return True
        err = err.__cause__ or err.__context__
    return False


def tree_bytes(path: Path) -> int:
    try:
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    except OSError:
        return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def free_bytes(path: Path) -> int:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 0


def disk_full_error(root: Path, name: str, newest: Path | None, free: int) -> StorageError:
    """The message for a checkpoint that did not fit. `newest`: the newest complete checkpoint
    (kept), whose size is what the next one needs; `free`: bytes left when the write failed."""
    needs = f"about {_mib(tree_bytes(newest))}, the size of {newest.name}" if newest else "more than that"
    kept = (f"{newest.name} is the newest complete checkpoint and resume=auto continues from it" if newest
            else "no earlier checkpoint exists, so resume=auto would start over")
    return StorageError(
        f"the disk is full: checkpoint {name} did not fit in {root} ({_mib(free)} were left when the write failed; a "
        f"checkpoint needs {needs}). "
        f"Nothing was lost: the partial {name} was removed and {kept}. Free space or keep fewer checkpoints "
        "(callbacks.checkpoint.keep_last_k=1) and run the same command with resume=auto; or move the run "
        "directory to a disk with room and continue there (hydra.run.dir=NEW_DIR resume=auto).")


def stored_once(state: dict) -> tuple[dict, dict[str, str]]:
    """safetensors refuses tensors that share memory (tied weights): (each tensor once, contiguous;
    {the other names of a shared tensor: the name it is stored under})."""
    first: dict[int, str] = {}
    unique = {}
    for name, tensor in state.items():
        key = tensor.untyped_storage().data_ptr()
        if key in first and tensor.numel():
            continue
        first[key] = name
        unique[name] = tensor.detach().contiguous()
    return unique, {n: first[t.untyped_storage().data_ptr()] for n, t in state.items() if n not in unique}


def readable_by_others(path: Path) -> None:
    """Give a file the mode `open()` would have given it under the process's umask (0644 with the
    usual 022): writers that create through a private temporary file (safetensors) leave 0600,
    which another user of a shared export folder cannot read."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
