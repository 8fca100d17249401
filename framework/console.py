"""What a training process prints besides metrics: a note when a phase runs long, and library
warnings shown once instead of once per rank and call."""
from __future__ import annotations

import contextlib
import sys
import threading
import time
import warnings

SLOW_AFTER_S = 3.0


@contextlib.contextmanager
def announce_if_slow(what: str, enabled: bool = True, why: str = "", after_s: float = SLOW_AFTER_S):
    """Say `what...` (and `why` it may take long) if the block is still running after `after_s`
    seconds, and how long it took when it ends; say nothing for a quick one (building a small
    model must not add a line)."""
    if not enabled:
        yield
        return
    lock, said = threading.Lock(), []
    start = time.perf_counter()

    def note() -> None:
        with lock:
            if said is not None:
                said.append(True)
                print(f"{what}{f' ({why})' if why else ''}...", flush=True)

    timer = threading.Timer(after_s, note)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            if said:
                print(f"{what}: done in {time.perf_counter() - start:.1f} s", flush=True)
            said = None  # a timer firing now stays silent


class WarningsOnce:
    """Python warnings in a training process: rank zero shows each distinct warning once (a
    library warning from inside a loop, or re-armed by libraries that reset the warning
    registry, otherwise repeats every step); the other ranks show none, since every rank runs
    the same code (`debug=true` shows them all). `restore()` puts the previous behaviour back."""

    def __init__(self, rank: int, debug: bool = False):
        self._saved = warnings.catch_warnings()  # filters and showwarning, put back by restore()
        self._saved.__enter__()
        self._seen: set[tuple[type, str]] = set()
        if debug:
            return
        if rank != 0:  # shown by no filter a library may set either
            warnings.simplefilter("ignore")
            warnings.showwarning = lambda *args, **kwargs: None
            return
        previous = warnings.showwarning

        def show_once(message, category, filename, lineno, file=None, line=None):
            key = (category, str(message))
            if key not in self._seen:
                self._seen.add(key)
                previous(message, category, filename, lineno, file, line)

        warnings.showwarning = show_once

    def restore(self) -> None:
        self._saved.__exit__(None, None, None)


_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000**2, "mb": 1000**2, "mib": 1 << 20,
               "g": 1000**3, "gb": 1000**3, "gib": 1 << 30, "t": 1000**4, "tb": 1000**4, "tib": 1 << 40}


def parse_size(text: str) -> int | None:
    """Bytes of a size as people write it (80GiB, 80GB, 81920MiB, 1.5TB, 1000000): None when it is
    not one."""
    number = str(text).strip().lower().replace("_", "")
    unit = number.lstrip("0123456789.")
    digits = number[:len(number) - len(unit)]
    try:
        value = float(digits)
    except ValueError:
        return None
    factor = _SIZE_UNITS.get(unit.strip())
    return int(value * factor) if factor is not None and value > 0 else None


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def warn(message: str, stream=None) -> None:
    """A warning as the user reads it, `WARNING: ...` on stderr at once: the one way the framework
    warns outside a worker's rank-zero console (the loop's `say` prefixes its own the same way)."""
    print(f"WARNING: {message}", file=stream or sys.stderr, flush=True)
