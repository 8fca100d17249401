"""A pipeline's checkpoint state, as the unsplit model's: each pipeline rank's part merged into
one state dict on rank zero, and a full state dict cut back to one rank's stages (its tied head's
copy given the embedding's entries). Pure functions over state dicts; the strategy gathers and
places (framework/strategy/mesh/pipeline/run.py, framework/strategy/mesh/state.py)."""
from __future__ import annotations

import torch


def merge_model_states(parts: list, tied_names: tuple[str, str] | None) -> dict:
    """The pipeline ranks' model states (None for ranks that sent none) as one; a tied head saved
    as the embedding's tensor under both names, as the unsplit model saves it."""
    state: dict = {}
    for part in parts:
        if part:
            state.update({name: value for name, value in part.items() if name not in state})
    if tied_names is not None:
        embedding, head = tied_names
        state[head] = state[embedding]
    return state


def without_copies(optimizer_state: dict, copies: set[str]) -> dict:
    """A rank's optimizer state without its tied head's copy (the embedding's entry holds it)."""
    return {"state": {name: entry for name, entry in optimizer_state["state"].items() if name not in copies},
            "param_groups": [{**group, "params": [name for name in group["params"] if name not in copies]}
                             for group in optimizer_state["param_groups"]]}


def merge_optimizer_states(parts: list) -> dict:
    """The pipeline ranks' optimizer states as one: every parameter's entry, and each param group's
    names in stage order (the groups' settings are the same on every rank)."""
    merged: dict = {"state": {}, "param_groups": []}
    for part in parts:
        if not part:
            continue
        merged["state"].update(part["state"])
        for index, group in enumerate(part["param_groups"]):
            if index == len(merged["param_groups"]):
                merged["param_groups"].append({**group, "params": []})
            known = merged["param_groups"][index]["params"]
            known += [name for name in group["params"] if name not in known]
    return merged


def optimizer_state_for(state: dict, names: set[str], copies: dict[str, str]) -> dict:
    """The part of a full optimizer state one rank loads: its parameters' entries and names, a tied
    head's copy given its own clone of the embedding's entries (the optimizer updates in place)."""
    entries = dict(state["state"])
    for source, copy in copies.items():
        if copy in names and source in entries:
            entries[copy] = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in entries[source].items()}
    groups = []
    for group in state["param_groups"]:
        listed = [*group["params"], *(copy for source, copy in copies.items() if source in group["params"])]
        groups.append({**group, "params": [name for name in listed if name in names]})
    return {"state": {name: entry for name, entry in entries.items() if name in names}, "param_groups": groups}


def loading_error(missing: list[str], unexpected: list[str]) -> str:
    """torch's own wording for names a state lacks or has too many of (framework/checkpoint/weights.py
    load_error_summary reads it)."""
    def quoted(names: list[str]) -> str:
        return ", ".join(f'"{name}"' for name in names)

    return ("Error(s) in loading state_dict for the pipeline's stages:"
            + (f"\n\tMissing key(s) in state_dict: {quoted(missing)}." if missing else "")
            + (f"\n\tUnexpected key(s) in state_dict: {quoted(unexpected)}." if unexpected else ""))
