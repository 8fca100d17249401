"""What the mixture-of-experts layers' records add up to (framework/models/moe.py, and a Hugging
Face family's watched routers: framework/models/hf_routers.py): the losses added to the task's, the
values logged beside the loss, the parameters a token goes through, `plan`'s line, and the bias
balancing's step."""
from __future__ import annotations

import weakref

import torch
from torch import nn

from framework.construction.routing import Routed
from framework.models.moe import MoE


def moe_layers(model: nn.Module) -> list[MoE]:
    """The model's MoE layers, in order (a wrapped model's too)."""
    return [m for m in routed_modules(model) if isinstance(m, MoE)]


def parameter_counts(model: nn.Module) -> tuple[int, int]:
    """(parameters, those one token goes through): the routed experts count by their active share."""
    total = active = 0.0
    seen: set[int] = set()
    for module in model.modules():
        fraction = getattr(module, "active_fraction", 1.0)
        for p in module.parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            n = p.numel()
            total, active = total + n, active + n * fraction
    return int(total), int(round(active))


def describe_experts(model: nn.Module) -> str | None:
    """`plan`'s line on a mixture of experts (None for a dense model)."""
    total, active = parameter_counts(model)
    if active == total:
        return None
    counts = f"{total:,} parameters, {active:,} active per token ({100 * active / max(total, 1):.0f}%)"
    layers = moe_layers(model)
    if not layers:  # a Hugging Face family's (framework/models/hf_routers.py)
        return f"mixture of experts: {counts}"
    s = layers[0].settings
    shared = f" + {s.shared_experts} shared" if s.shared_experts else ""
    blocks = len(getattr(model, "blocks", ())) or len(layers)
    return f"mixture of experts: {len(layers)} of {blocks} Blocks, {s.num_experts} experts{shared}, top-{s.top_k}; {counts}"


_ROUTED: "weakref.WeakKeyDictionary[nn.Module, list[Routed]]" = weakref.WeakKeyDictionary()


def routed_modules(model: nn.Module) -> list[Routed]:
    """The model's routing modules, found once per model (asked every micro-batch, of dense models
    too: a walk over every module each time would cost a large model's step)."""
    found = _ROUTED.get(model)
    if found is None:
        found = _ROUTED[model] = [m for m in model.modules() if isinstance(m, Routed)]
    return found


def router_losses(model: nn.Module, summed: bool) -> torch.Tensor | None:
    """The sum of every routing module's losses of the last forward (None: none adds any)."""
    found = [loss for module in routed_modules(model) if (loss := module.losses(summed)) is not None]
    return sum(found[1:], found[0]) if found else None


def router_values(model: nn.Module) -> dict[str, torch.Tensor]:
    """What MoE users look at, from the last training forward (tensors: no device sync): the
    balancing loss (a mean over the tokens, unweighted, over the routing modules) and the built-in
    layers' z-loss, each layer's load (its busiest and its idlest expert's tokens over the mean,
    named by its layer) and, with a capacity, the fraction of routed tokens dropped."""
    modules = [m for m in routed_modules(model) if m.record is not None]
    terms = router_terms(modules)
    values = {name: total / count for name, (total, count) in terms.items() if name != "moe_dropped"}
    for module in modules:
        for layer, counts in module.loads():
            values.update(load_values(layer, counts))
    if "moe_dropped" in terms:
        total, count = terms["moe_dropped"]
        values["moe_dropped"] = total / count
    return values


def router_terms(modules: list[Routed]) -> dict[str, tuple[torch.Tensor, int]]:
    """router_values' model-wide values before their mean over the layers: each one's sum over
    `modules` (those with a record) and how many layers it summed (a pipeline's stages each hold
    some of the layers: framework/models/stage_routing.py)."""
    modules = [m for m in modules if m.record is not None]
    if not modules:
        return {}
    terms = {"moe_balance_loss": (sum(m.record.balance.detach() / max(m.record.tokens, 1) for m in modules),
                                  len(modules))}
    own = [m for m in modules if isinstance(m, MoE)]
    if own:
        terms["moe_z_loss"] = (sum(m.record.z.detach() / max(m.record.tokens, 1) for m in own), len(own))
    if any(m.settings.capacity_factor is not None for m in own):
        terms["moe_dropped"] = (sum(m.record.dropped for m in own), len(own))
    return terms


def load_values(layer, counts: torch.Tensor) -> dict[str, torch.Tensor]:
    """A layer's load from its tokens per expert: the busiest and the idlest expert's over the mean."""
    mean = counts.mean().clamp(min=1e-9)
    return {f"moe_load_max/{layer}": counts.max() / mean, f"moe_load_min/{layer}": counts.min() / mean}


def update_expert_biases(model: nn.Module, stepped: bool = True) -> None:
    """After an optimizer step: every bias-balanced layer's bias moved by the step's counts (a step
    left out: its counts forgotten, as its batches are)."""
    for layer in moe_layers(model):
        layer.update_bias(stepped)
