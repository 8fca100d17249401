"""Capture and restore every random number generator a run draws from."""
from __future__ import annotations

import random
import sys

import numpy as np
import torch


def _xla():
    """torch_xla's xla_model once an XLA runtime runs in this process (its device RNG is a seed
    of its own, which torch.manual_seed does not touch), else None."""
    if "torch_xla" not in sys.modules:
        return None
    import torch_xla
    import torch_xla.core.xla_model as xm

    return xm if torch_xla._XLAC._xla_runtime_is_initialized() else None


def rng_state() -> dict:
    """Plain containers and tensors only, so checkpoints load with weights_only=True."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if (xm := _xla()) is not None:
        state["xla"] = int(xm.get_rng_state())  # an unsigned 64-bit seed: a plain int, not an int64 tensor
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "xla" in state and (xm := _xla()) is not None:
        xm.set_rng_state(int(state["xla"]))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if (xm := _xla()) is not None:
        xm.set_rng_state(seed)
