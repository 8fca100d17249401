"""The state dicts every strategy starts from (Strategy's checkpoint-state methods): full state keyed
by parameter name (the same for every wrapper: DDP's "module." prefix, FSDP's DTensors), so a
checkpoint moves between strategies, and each rank's own parts for DCP. torch.distributed.checkpoint is imported where it is used: it
costs ~0.6 s, and a single-process run (the default job) never needs it."""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist

from framework.checkpoint_io import dcp_reader as sharded
from framework.construction.named_state import regrouped, strict_load
from framework.tensors import write_part


def full_model_state(model: torch.nn.Module) -> dict:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=full_state_options())


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=full_state_options())


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, copy_structure(state), options=full_state_options(loading=True))


def sharded_state(strategy, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
    """What `strategy` writes to a DCP directory: each rank's own parts, or, for a strategy without
    sharded state, its full state (rank zero's)."""
    if not strategy.abilities.sharded_state:
        state = {"model": strategy.model_state_dict(model)}
        if optimizer is not None:
            state["optimizer"] = strategy.optimizer_state_dict(model, optimizer)
        return state
    return live_sharded(model, optimizer)


def load_sharded_state(strategy, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                       state_dir) -> None:
    """Collective: a DCP directory loaded by `strategy`: read whole and loaded through its full-state
    loaders where it has no sharded state, else read into each rank's own tensors (load_sharded).
    The saved optimizer groups are refitted to the live ones either way (named_state.regrouped)."""
    if strategy.abilities.sharded_state:
        load_sharded(strategy, model, optimizer, state_dir)
        return
    full = sharded.read_full(state_dir, ("model", "optimizer") if optimizer is not None else ("model",))
    strategy.load_model_state_dict(model, full["model"])
    if optimizer is not None:
        strategy.load_optimizer_state_dict(model, optimizer,
                                           regrouped(full["optimizer"], strategy.unwrap(model), optimizer))


def load_sharded(strategy, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, state_dir) -> None:
    """Collective: a DCP directory read into this rank's own tensors (resharded on read), laid out
    as the strategy writes it (its sharded_state_dict), then loaded."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=False)
    live = live_sharded(model, optimizer)  # this rank's own tensors
    # laid out as they were written: the live tensors themselves, or copies where the strategy
    # writes another layout (model_parallel's fused layers), placed back after the read
    template = strategy.sharded_state_dict(model, optimizer)
    if optimizer is not None:  # the groups read as they were saved, refitted to the live ones after
        saved_groups = sharded.saved_subtree(state_dir, ("optimizer", "param_groups"))
        if saved_groups is not None:
            template["optimizer"]["param_groups"] = saved_groups
    sharded.load_into(template, state_dir)
    state = _into_live(live, template)
    set_model_state(strategy, model, state["model"], options)
    if optimizer is not None:
        state["optimizer"] = regrouped(state["optimizer"], strategy.unwrap(model), optimizer)
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=options)


def live_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
    """This rank's parts: the model's and optimizer's own tensors (DCP loads into them in place)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=False)
    state = {"model": get_model_state_dict(model, options=options)}
    if optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer, options=options)
    return state


def _into_live(live: Any, loaded: Any) -> Any:
    """`loaded` (read by DCP into `template`) with each tensor that is not the live one written into
    the live one, this rank's part of it; other values (settings, step counts) as loaded."""
    if isinstance(live, dict) and isinstance(loaded, dict):
        return {key: _into_live(live[key], value) if key in live else value for key, value in loaded.items()}
    if isinstance(live, list) and isinstance(loaded, list) and len(live) == len(loaded):
        return [_into_live(a, b) for a, b in zip(live, loaded)]
    if isinstance(live, torch.Tensor) and isinstance(loaded, torch.Tensor) and loaded is not live:
        write_part(loaded.full_tensor() if hasattr(loaded, "full_tensor") else loaded, live)
        return live
    return loaded


def full_state_options(loading: bool = False):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=_distributed() and not loading)


def set_model_state(strategy, model: torch.nn.Module, state: dict, options) -> None:
    """A whole replica per rank (ddp) loads through the module's own loader, which also takes the
    state a module keeps beside its parameters (a quantized layer's statistics: DCP maps only
    parameter and buffer names through the wrapper); sharded models through DCP."""
    strict = strict_load(strategy.unwrap(model), state)  # an adapter checkpoint: the trainable weights alone
    if not strategy.shards_states:
        strategy.unwrap(model).load_state_dict(state, strict=strict)
        return
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    # DCP rewrites the dict it is given (key prefixes, DTensors): hand it a copy of the structure
    set_model_state_dict(model, copy_structure(state), options=dataclasses.replace(options, strict=strict))


def copy_structure(data: Any) -> Any:
    """Nested dicts and lists copied, tensors and other leaves shared (no memory cost)."""
    if isinstance(data, dict):
        return {k: copy_structure(v) for k, v in data.items()}
    if isinstance(data, list):
        return [copy_structure(v) for v in data]
    return data


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()
