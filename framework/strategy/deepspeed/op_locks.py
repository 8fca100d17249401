"""Op builds that never wait without a bound or a word.

DeepSpeed compiles its ops (the shared-memory communication op, the NVMe op, the fused and CPU
Adam) through torch.utils.cpp_extension, which guards each op's build folder with a `lock` file
(torch.utils.file_baton.FileBaton): the process that creates it builds, every other one waits
while the file exists. A builder stopped mid-build (Ctrl-C, a timeout, preemption, the OOM
killer) leaves the file behind, and every later process that needed the op waited forever, at 0%
CPU, saying nothing (seen: 9 minutes on a fresh machine after a killed first NVMe run).

Watched here, in every process of a DeepSpeed run:
- a framework process that builds holds an flock on `lock.owner` beside the lock, taken before the
  lock is made and given back after it is removed, and writes there which lock it made (the
  kernel drops the flock when the process dies, however it dies);
- a lock whose owner file names it while nobody holds the flock was left by a builder that is
  gone: the next process to build takes it over (removes it, says so, builds);
- a process that waits says what for every `SAY_EVERY_S` seconds, and stops with the cause and
  the fix when the builder it waits for dies (the next run builds the op);
- a lock that no framework process made (a plain torch or DeepSpeed build) is waited for as torch
  waits, with the same words, including how to remove it if no build is running.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys
import time

from torch.utils.file_baton import FileBaton

from framework.errors import ConfigError, UserError
from framework.paths import check_creatable_dir

SAY_EVERY_S = 30.0
OWNER_SUFFIX = ".owner"

_installed = False


class OpBuildStopped(UserError):
    """The process building an op stopped mid-build while this one waited for it."""


def _say(line: str) -> None:
    print(f"deepspeed: {line}", file=sys.stderr, flush=True)


def _identity(path: str) -> str | None:
    """What tells one lock file from another made later at the same path."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return f"{stat.st_ino}:{stat.st_mtime_ns}"


def _hold_owner(lock: str) -> int | None:
    """The owner file's descriptor with its flock held, or None when a live process holds it."""
    fd = os.open(lock + OWNER_SUFFIX, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


def _recorded(fd: int) -> tuple[str, str]:
    """(the identity of the lock the last framework builder made, its pid) from the owner file."""
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 256).decode("ascii", errors="replace").split()
    return (text[0], text[1]) if len(text) >= 2 else ("", "?")


def _left_by_dead_builder(lock: str, fd: int) -> str | None:
    """With the owner flock held (no framework builder alive): the dead builder's pid when the lock
    at `lock` is the one it made, else None (no lock, or one made by something else)."""
    identity, pid = _recorded(fd)
    return pid if identity and identity == _identity(lock) else None


def _release_owner(fd: int, clear: bool) -> None:
    if clear:
        os.ftruncate(fd, 0)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def watch_op_builds() -> None:
    """Install the watch on torch's FileBaton, once per process (idempotent)."""
    global _installed
    if _installed:
        return
    original_acquire, original_release = FileBaton.try_acquire, FileBaton.release

    def try_acquire(self) -> bool:
        lock = self.lock_file_path
        fd = _hold_owner(lock)
        if fd is None:  # a live framework process is building this op: wait for it
            return False
        dead = _left_by_dead_builder(lock, fd)
        if dead is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(lock)
            _say(f"{os.path.dirname(lock)}: the process that was building this op (pid {dead}) stopped before it "
                 "finished and left its lock; building it here")
        if not original_acquire(self):  # a lock no framework process made: torch's own wait
            _release_owner(fd, clear=False)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{_identity(lock)} {os.getpid()}\n".encode("ascii"))
        os.fsync(fd)
        self._owner_fd = fd
        return True

    def release(self) -> None:
        original_release(self)
        fd = getattr(self, "_owner_fd", None)
        if fd is not None:
            self._owner_fd = None
            _release_owner(fd, clear=True)

    def wait(self) -> None:
        lock = self.lock_file_path
        folder = os.path.dirname(lock)
        started = said = time.monotonic()
        while True:
            # A framework builder holds the owner flock from before it makes the lock until after it
            # removes it: a lock not there yet while the flock is held is a build about to start, not
            # a finished one (a waiter that looked only at the lock went on to load an op not built).
            fd = _hold_owner(lock)
            if fd is not None:
                dead = _left_by_dead_builder(lock, fd)
                if dead is not None:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(lock)
                    _release_owner(fd, clear=True)
                    raise OpBuildStopped(
                        f"deepspeed: the process building the op in {folder} (pid {dead}) stopped before it "
                        "finished, while this run waited for it; its lock is removed. Run again: the next run "
                        "builds the op.")
                _release_owner(fd, clear=False)
                if not os.path.exists(lock):
                    return
            time.sleep(self.wait_seconds)
            now = time.monotonic()
            if now - said >= SAY_EVERY_S:
                said = now
                _say(f"waiting {now - started:.0f} s for another process to build the op in {folder} (a first "
                     f"build takes minutes). If no build is running (a run stopped mid-build leaves its lock), "
                     f"remove {lock} and run again.")

    FileBaton.try_acquire, FileBaton.release, FileBaton.wait = try_acquire, release, wait
    _installed = True


def build_root_problem() -> str | None:
    """The folder DeepSpeed's ops are compiled into (TORCH_EXTENSIONS_DIR, else torch's cache
    folder) must be creatable and writable, or the first op build fails mid-run: said before launch."""
    # torch's default on Linux (torch.utils.cpp_extension.get_default_build_root, not imported: 0.1 s)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(cache, "torch_extensions")
    try:
        check_creatable_dir(root, "TORCH_EXTENSIONS_DIR", "set TORCH_EXTENSIONS_DIR to a folder you can write (DeepSpeed "
                                                          "compiles its ops there once per machine)")
    except ConfigError as err:
        return str(err)
    return None
