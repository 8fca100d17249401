"""TORCH_CUDA_ARCH_LIST as DeepSpeed's op builder can read it.

CUDA images for Hopper and Blackwell set architecture-specific targets such as `9.0a` or `10.0a`
(features that only code built for that exact chip may use). torch reads them; DeepSpeed 0.19's op
builder parses each entry's minor version as an integer and dies on them (`invalid literal for
int() with base 10: '0a'`, measured on an H100 image building FusedAdam). Its ops (FusedAdam,
CPUAdam, the communication ops) use nothing architecture-specific, so the suffix is dropped for
the build: `9.0a` becomes `9.0`, `9.0a+PTX` becomes `9.0+PTX`.
"""
from __future__ import annotations

import os
import re

VARIABLE = "TORCH_CUDA_ARCH_LIST"
_SUFFIXED = re.compile(r"^(\d+)\.(\d+)[a-z]+(\+PTX)?$", re.IGNORECASE)


def readable(entry: str) -> str:
    """One entry without its architecture suffix (`9.0a` -> `9.0`); anything else unchanged."""
    match = _SUFFIXED.match(entry.strip())
    return f"{match[1]}.{match[2]}{match[3] or ''}" if match else entry.strip()


def readable_arch_list() -> str:
    """Rewrite TORCH_CUDA_ARCH_LIST in this process's environment where DeepSpeed could not read it;
    returns what was done, to be said once ('' when nothing was)."""
    given = os.environ.get(VARIABLE, "")
    entries = [e for e in re.split(r"[;\s]+", given) if e]
    fixed = list(dict.fromkeys(readable(e) for e in entries))
    if fixed == entries:
        return ""
    os.environ[VARIABLE] = ";".join(fixed)
    return (f"deepspeed: {VARIABLE}={given} has architecture suffixes DeepSpeed's op builder cannot read; its ops "
            f"are built for {os.environ[VARIABLE]} (they use nothing architecture-specific). Set {VARIABLE} yourself "
            "to choose.")
