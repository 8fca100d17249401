"""Checkpoint state of a mesh layout, written once: each rank's own tensors gathered whole tensor by
tensor (fused layers by hand: fused.py), a fused layer's values placed back by hand after a load, and
a fused layer laid out for DCP as one chunk per rank. A pipeline's gather over its ranks and the cut
of a whole state to a rank's stages: framework/strategy/mesh/pipeline/run.py and state.py."""
from __future__ import annotations

import torch

from framework.strategy.mesh.fused import contiguous_layout, fused_entries, whole_tensor
from framework.strategy.mesh.pipeline.state import optimizer_state_for
from framework.strategy.state_dicts import copy_structure
from framework.tensors import map_tensors, write_part


def own_model_state(model: torch.nn.Module) -> dict:
    """Collective: the whole tensors of this rank's modules, under the model's names, on every rank
    (DCP's full-state gather would redistribute a fused layer's strided shards, which it cannot)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    own = get_model_state_dict(model, options=StateDictOptions(full_state_dict=False))
    return {name: whole_tensor(value) for name, value in own.items()}


def own_optimizer_state(model: torch.nn.Module, optimizer) -> dict:
    """Collective: the optimizer's state for this rank's parameters, each tensor whole."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    own = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=False))
    return {"state": {name: {key: whole_tensor(value) for key, value in entry.items()}
                      for name, entry in own["state"].items()},
            "param_groups": own["param_groups"]}


def place_fused(model: torch.nn.Module, model_state: dict | None, optimizer=None, optimizer_state: dict | None = None):
    """Write a fused layer's loaded values (and its optimizer state's) into this rank's part by hand,
    as the layout was made (DTensor's own placement gets the nested split wrong)."""
    for name, entry in fused_entries(model, optimizer).items():
        if model_state is not None and name in model_state:
            write_part(model_state[name], entry["param"])
        if optimizer_state is not None:
            for key, tensor in entry.items():
                if key != "param" and key in optimizer_state["state"].get(name, {}):
                    write_part(optimizer_state["state"][name][key], tensor)


def load_whole_model_state(part: torch.nn.Module, mine: dict, strict: bool) -> None:
    """A pipeline rank's entries of a whole model's state loaded into its stages."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(part, copy_structure(mine), options=StateDictOptions(full_state_dict=True, strict=strict))
    place_fused(part, mine)


def pipeline_optimizer_state(part: torch.nn.Module, full: dict) -> dict:
    """The part of a whole optimizer state a pipeline rank's stages load (a tied head's copy given
    its own clone of the embedding's entries)."""
    return optimizer_state_for(full, {name for name, _ in part.named_parameters()}, part.tied_copies())


def contiguous(sharded: dict) -> dict:
    """A sharded state with each fused layer laid out as one contiguous chunk per rank (DCP)."""
    return map_tensors(sharded, contiguous_layout)
