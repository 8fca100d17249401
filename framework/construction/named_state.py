"""Full state by parameter name for a plain (unwrapped, unsharded) module, with nothing but the
module's and optimizer's own state_dict: the same layout torch.distributed.checkpoint.state_dict
produces (tied parameters once in the optimizer, under their first name), without importing it
(that import costs ~1.7 s, paid at a run's first checkpoint)."""
from __future__ import annotations

import torch

# peft's names for an adapter's own weights (framework/adapter/lora.py)
ADAPTER_WEIGHTS = (".lora_A.", ".lora_B.", ".lora_magnitude_vector")


def may_be_missing(name: str, parameter: torch.nn.Parameter) -> bool:
    """A parameter a state may lack: a frozen one (an adapter checkpoint holds the trainable
    weights alone; the frozen ones are in the model already, from its pretrained weights or its
    seeded initialisation), or an adapter's own (pretrained weights predate the adapter)."""
    return not parameter.requires_grad or any(marker in name for marker in ADAPTER_WEIGHTS)


def strict_load(module: torch.nn.Module, state: dict) -> bool:
    """Whether loading `state` into `module` must find every key: False only when every parameter
    it lacks may be missing (`may_be_missing`)."""
    return not all(may_be_missing(n, p) for n, p in module.named_parameters() if n not in state)


def _names_in_optimizer_order(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    names = {id(p): n for n, p in model.named_parameters()}
    try:
        return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    except KeyError as err:
        raise ValueError("the optimizer holds a parameter that is not the model's") from err


def optimizer_state_by_name(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    order = _names_in_optimizer_order(model, optimizer)
    by_index = optimizer.state_dict()
    return {"state": {order[i]: value for i, value in by_index["state"].items()},
            "param_groups": [{**{k: v for k, v in group.items() if k != "params"},
                              "params": [order[i] for i in group["params"]]} for group in by_index["param_groups"]]}


def load_optimizer_state_by_name(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    index = {name: i for i, name in enumerate(_names_in_optimizer_order(model, optimizer))}
    optimizer.load_state_dict({
        "state": {index[name]: value for name, value in state["state"].items()},
        "param_groups": [{**{k: v for k, v in group.items() if k != "params"},
                          "params": [index[name] for name in group["params"]]} for group in state["param_groups"]],
    })


def regrouped(state: dict, module: torch.nn.Module, optimizer) -> dict:
    """A by-name optimizer state whose parameter groups are laid out as `optimizer`'s are: a state
    saved with one group (before biases and norms had a group of their own without weight decay,
    framework/tasks/decay.py; or by DeepSpeed, which saves one) loads into two, and the other way.
    Each live group takes the settings of the saved group that held its first parameter (its
    learning rate, betas...), keeping its own weight_decay, which the grouping decides. Unchanged
    where the layouts agree, or where the live optimizer's groups are not `module`'s named parameters
    (DeepSpeed's flat partitions, or none at all under ZeRO-3: its own loader maps them)."""
    names = {id(p): n for n, p in module.named_parameters()}
    live = [[names.get(id(p)) for p in group["params"]] for group in optimizer.param_groups]
    saved = state.get("param_groups") or []
    # a group's names in the live order too: torch's load_state_dict pairs a group's parameters by position
    if not all(live) or any(None in group for group in live) or [g["params"] for g in saved] == live:
        return state  # (ZeRO-3's torch optimizer holds no parameter of the module's at all)
    home = {name: group for group in saved for name in group["params"]}
    groups = []
    for group, group_names in zip(optimizer.param_groups, live):
        source = next((home[n] for n in group_names if n in home), group)
        settings = {k: v for k, v in source.items() if k != "params"}
        if "weight_decay" in group:
            settings["weight_decay"] = group["weight_decay"]
        groups.append({**settings, "params": group_names})
    return {**state, "param_groups": groups}
