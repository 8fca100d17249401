"""DeepSpeed's checkpoint state as every other strategy's: full fp32 tensors keyed by parameter name
(gathered from ZeRO's partitions with DeepSpeed's own safe_get/safe_set helpers), so a checkpoint
moves between DeepSpeed stages and any other strategy. Each function takes the engine's module
(and optimizers): the strategy (base.py) decides which rank keeps the result."""
from __future__ import annotations

import torch

from framework.construction.named_state import may_be_missing
from framework.errors import ConfigError
from framework.strategy.deepspeed.imports import deepspeed_package


def _named_params(module) -> dict:
    return dict(module.named_parameters(remove_duplicate=False))


def full_model_state(module) -> dict:
    """Collective: every parameter's full fp32 value and every buffer, on the CPU."""
    from deepspeed.utils import safe_get_full_fp32_param

    params = _named_params(module)
    state = {}
    for key, value in module.state_dict(keep_vars=True).items():
        if key in params:
            full = safe_get_full_fp32_param(params[key])
            value = full if full is not None else params[key].detach()
        state[key] = value.detach().to("cpu", copy=True)
    return state


def full_optimizer_state(module, zero, optimizer) -> dict:
    """Collective: each trainable parameter's full optimizer state (and the step), by name (`zero`:
    the engine's ZeRO optimizer; `optimizer`: the torch one inside it)."""
    from deepspeed.utils import safe_get_full_optimizer_state

    if hasattr(zero, "_lazy_init_hp_params_optimizer_state"):
        # ZeRO 1/2 link each parameter to its optimizer state after the first group's first step,
        # before the other groups have any (DeepSpeed 0.19): with two groups (weight decay and
        # none, framework/tasks/decay.py) the second's were linked to nothing; linked again here
        zero._hp_optimizer_states_linked = False
        zero._lazy_init_hp_params_optimizer_state()
    params = _named_params(module)
    inner_state = next(iter(optimizer.state.values()), {}) if optimizer.state else {}
    tensor_keys = [k for k, v in inner_state.items() if torch.is_tensor(v) and v.dim() > 0]
    step = inner_state.get("step")
    state = {}
    seen = set()
    for name, param in params.items():
        if id(param) in seen or not param.requires_grad:  # frozen (an adapter's base): no optimizer state
            continue
        seen.add(id(param))
        entry = {key: safe_get_full_optimizer_state(param, key).detach().cpu() for key in tensor_keys}
        if step is not None:
            entry["step"] = step.detach().cpu().clone() if torch.is_tensor(step) else torch.tensor(float(step))
        state[name] = entry
    return {"state": state, "param_groups": _named_groups(params, zero, optimizer, list(state))}


def _named_groups(params: dict, zero, optimizer, names: list[str]) -> list[dict]:
    """The torch optimizer's groups (settings and parameter names) as a plain optimizer over the
    module would have them: ZeRO keeps each group's module parameters beside the flat partitions the
    torch optimizer holds (bit16_groups at stages 1-2, at 3 fp16_groups: sub-groups, each of one
    group). Every group's settings are saved: a resume restores each group's learning rate."""
    members = getattr(zero, "bit16_groups", None)
    if members is None and hasattr(zero, "fp16_groups") and hasattr(zero, "sub_group_to_group_id"):
        members = [[] for _ in optimizer.param_groups]  # ZeRO-3: sub-groups, each of one group
        for sub_group, member in enumerate(zero.fp16_groups):
            members[zero.sub_group_to_group_id[sub_group]].extend(member)
    by_id = {}
    for name, param in params.items():  # a tied parameter under its first name, as in the state
        by_id.setdefault(id(param), name)
    settings = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    if not members or len(members) != len(settings):  # one group of every parameter, as before
        return [settings[0] | {"params": names}]
    kept = set(names)
    return [group | {"params": [by_id[id(p)] for p in member if by_id.get(id(p)) in kept]}
            for group, member in zip(settings, members)]


def load_full_model_state(module, state: dict, device: torch.device) -> None:
    """Collective: the full values written into ZeRO's master weights and the module's own copies."""
    from deepspeed.utils import safe_set_full_fp32_param

    params = _named_params(module)
    seen = set()
    for name, param in params.items():
        if id(param) in seen:
            continue
        seen.add(id(param))
        if name not in state:
            if may_be_missing(name, param):  # frozen, or an adapter's own weight (framework/adapter/)
                continue
            raise ConfigError(f"the checkpoint has no weights for parameter '{name}'.")
        value = state[name].to(device, torch.float32)
        if hasattr(param, "_z3_optimizer") or hasattr(param, "_hp_mapping"):
            safe_set_full_fp32_param(param, value)
            _refresh_low_precision(param, value)
        elif hasattr(param, "ds_id"):  # partitioned with no optimizer (a frozen model): no master weights
            _refresh_low_precision(param, value)
        else:
            with torch.no_grad():
                param.copy_(value)
    buffers = dict(module.named_buffers())
    with torch.no_grad():
        for name, buffer in buffers.items():
            if name in state:
                buffer.copy_(state[name])


def _refresh_low_precision(param, value) -> None:
    """The module's own (bf16/fp16, possibly partitioned) copy of a parameter follows the
    fp32 master weights."""
    deepspeed = deepspeed_package()

    if hasattr(param, "ds_id"):
        with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
            with torch.no_grad():
                param.copy_(value.to(param.dtype))
    else:
        with torch.no_grad():
            param.copy_(value.to(param.dtype))


def _ensure_optimizer_state(zero, optimizer, saved: dict) -> None:
    """Torch optimizers create their state at the first step; a fresh engine has none to load
    into. Create it (zeros, shaped like DeepSpeed's flat fp32 partitions) and let ZeRO link it
    to the parameters, as its first step would."""
    example = next(iter(saved.values()), {})
    keys = [k for k, v in example.items() if torch.is_tensor(v) and v.dim() > 0]
    # ZeRO-1/2 put their flat partitions in the torch optimizer's groups; ZeRO-3 keeps them aside
    flats = [p for g in optimizer.param_groups for p in g["params"]]
    flats += list(getattr(zero, "fp32_partitioned_groups_flat", []))
    created = False
    # a fused or capturable torch optimizer keeps its step counts on the parameters' device (a
    # CPU step stopped fused AdamW's first step after a resume: "state_steps is on cpu", found
    # on an H100 under deepspeed_stage_3); others keep them on the CPU, as torch does
    on_device = any(group.get("fused") or group.get("capturable") for group in optimizer.param_groups)
    for flat in flats:
        if not optimizer.state.get(flat):
            step = torch.tensor(0.0, device=flat.device if on_device else "cpu")
            optimizer.state[flat] = {"step": step, **{k: torch.zeros_like(flat) for k in keys}}
            created = True
    if created and hasattr(zero, "_lazy_init_hp_params_optimizer_state"):  # ZeRO 1/2 link lazily
        zero._hp_optimizer_states_linked = False
        zero._lazy_init_hp_params_optimizer_state()


def load_full_optimizer_state(module, zero, optimizer, state: dict, device: torch.device) -> None:
    """Collective: each parameter's full optimizer state written into ZeRO's partitions (`zero`: the
    engine's ZeRO optimizer; `optimizer`: the torch one inside it), the step and group settings."""
    from deepspeed.utils import safe_set_full_optimizer_state

    params = _named_params(module)
    saved = state["state"]
    _ensure_optimizer_state(zero, optimizer, saved)
    step = None
    seen = set()
    for name, param in params.items():
        if id(param) in seen or name not in saved:
            continue
        seen.add(id(param))
        for key, value in saved[name].items():
            if key == "step":
                step = value
                continue
            safe_set_full_optimizer_state(param, value.to(device, torch.float32), key)
    if step is not None:
        for inner in optimizer.state.values():
            if "step" in inner:
                inner["step"] = _as_live_step(step, inner["step"])
    for group, saved_group in zip(optimizer.param_groups, state.get("param_groups", [])):
        for key, value in saved_group.items():
            if key != "params":
                group[key] = value


def _as_live_step(saved, live):
    """The saved step count in the form the live optimizer keeps it: a tensor on the live one's
    device and in its dtype (a fused optimizer refuses steps elsewhere), or a number."""
    if torch.is_tensor(live):
        return torch.as_tensor(saved).detach().clone().to(device=live.device, dtype=live.dtype)
    return float(saved)
