"""What the loop does for replica groups (fault_tolerance=torchft, framework/fault_tolerance/):
the whole training state a healing peer copies, and taking it from a live one. A group that copies
a peer's state continues from the step and data position that state holds (FitLoop restarts its
epoch's batches there).

The state is this rank's own part of it, in torch's distributed state-dict form (whole tensors
under ddp, each rank's shards under fsdp): rank r of a healing group takes rank r's of a live
one, whose layout is the same (the same strategy at the same world size)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from framework.fault_tolerance.base import GroupLayout
from framework.loop.loop_record import load_loop_state, loop_state
from framework.tensors import map_tensors


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local part (what rank r of a group holds); a tensor as it is."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _into(live: Any, copied: Any) -> Any:
    """`copied` (a peer's state, local parts) written into this rank's own tensors in `live`, in
    place, so DTensors keep their mesh and placements; other values (settings, counts) as copied."""
    if isinstance(live, dict) and isinstance(copied, dict):
        return {key: _into(live[key], value) if key in live else value for key, value in copied.items()}
    if isinstance(live, list) and isinstance(copied, list) and len(live) == len(copied):
        return [_into(a, b) for a, b in zip(live, copied)]
    if isinstance(live, torch.Tensor) and isinstance(copied, torch.Tensor) and _local(live).shape == copied.shape:
        with torch.no_grad():
            _local(live).copy_(copied)
        return live
    return copied


def group_layout(loop) -> GroupLayout:
    """What this rank of its group holds: the strategy, the group's size, and each tensor of its
    model state (name, local shape, dtype) as a heal would copy it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    strategy = loop.strategy
    state = get_model_state_dict(loop.model, options=StateDictOptions(full_state_dict=False))
    tensors = [(name, tuple(_local(t).shape), str(t.dtype)) for name, t in state.items() if isinstance(t, torch.Tensor)]
    values = sum(_local(t).numel() for t in state.values() if isinstance(t, torch.Tensor))
    processes = f"{strategy.world_size} process{'es' if strategy.world_size > 1 else ''}"
    words = (f"strategy={strategy.name} at {processes} a group, its rank {strategy.global_rank} holding {values:,} "
             f"values in {len(tensors)} tensors")
    return GroupLayout.of(words, tensors)


def heal_state(loop) -> dict:
    """This rank's whole training state, for the same rank of a group that heals from it (read on
    torchft's thread while the loop waits for the step's quorum: nothing changes it meanwhile)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=False)
    return {"model": map_tensors(get_model_state_dict(loop.model, options=options), _local),
            "optimizer": map_tensors(get_optimizer_state_dict(loop.model, loop.optimizer, options=options), _local),
            "loop": loop_state(loop)}


def load_heal_state(loop, state: dict) -> None:
    """A live peer's state (heal_state) in place of this rank's: weights, optimizer, the loop's step,
    data position, scheduler, RNG, guard and callbacks' state, as a resume loads them."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=False)
    model = _into(get_model_state_dict(loop.model, options=options), state["model"])
    # the live optimizer state (made by torch where a fresh group has none yet), then the peer's in it
    optimizer = _into(get_optimizer_state_dict(loop.model, loop.optimizer, options=options), state["optimizer"])
    set_model_state_dict(loop.model, model, options=options)
    set_optimizer_state_dict(loop.model, loop.optimizer, optimizer, options=options)
    load_loop_state(loop, state["loop"], {"world_size": loop.strategy.world_size}, Path("a live replica group"))
