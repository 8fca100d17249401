"""Compile DeepSpeed's CPU ops ahead of the first run: `python -m framework.strategy.deepspeed.prebuild`.

DeepSpeed compiles an op the first time a run needs it (torch.utils.cpp_extension, cached in
TORCH_EXTENSIONS_DIR, by default ~/.cache/torch_extensions/): the shared-memory communication op
at every DeepSpeed run on the CPU (about a minute on 2 cores), the NVMe ops (`async_io`,
`pin_memory`) at the first NVMe-offload run (minutes). Building them here, once, moves that wait
out of the first run: into a container image's build, a cluster's setup script, or `make test`'s
set-up. An op whose system library is missing (libaio for the NVMe ops) is left out with the reason.

torch names the cache folder by Python and CUDA version only, so two environments with different
torch versions sharing it rebuild each other's ops: give each its own TORCH_EXTENSIONS_DIR.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from framework.strategy.deepspeed.imports import deepspeed_package

#: the ops DeepSpeed's CPU accelerator loads in the framework's runs, by its builder names
CPU_OPS = ("ShareMemCommBuilder", "AsyncIOBuilder", "PinMemoryBuilder")


def build(names: tuple[str, ...] = CPU_OPS) -> list[tuple[str, str]]:
    """Build (or load from the cache) each op; returns (op, what happened) per op."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read at DeepSpeed's first import
    deepspeed_package()  # with the framework's watch on op builds (framework/strategy/deepspeed/op_locks.py)
    from deepspeed.accelerator import get_accelerator

    done = []
    for name in names:
        builder = get_accelerator().create_op_builder(name)
        if builder is None or builder.NAME == "deepspeed_not_implemented":  # DeepSpeed's stand-in for a missing op
            done.append((name, f"not an op of DeepSpeed's {get_accelerator().device_name()} accelerator"))
            continue
        if not builder.is_compatible(verbose=False):
            done.append((builder.NAME, "left out: its system library is missing (libaio-dev for the NVMe ops)"))
            continue
        started = time.perf_counter()
        try:
            builder.load(verbose=False)
        except Exception as err:  # noqa: BLE001  (a compiler error: said per op, the others still built)
            done.append((builder.NAME, f"failed: {(str(err).strip().splitlines() or [type(err).__name__])[-1]}"))
            continue
        done.append((builder.NAME, f"ready ({time.perf_counter() - started:.0f} s)"))
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or "~/.cache/torch_extensions (torch's default)"
    print(f"DeepSpeed ops into {root}:", flush=True)
    outcomes = build(CPU_OPS)
    for name, outcome in outcomes:
        print(f"  {name}: {outcome}", flush=True)
    return 1 if any(outcome.startswith("failed") for _, outcome in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
