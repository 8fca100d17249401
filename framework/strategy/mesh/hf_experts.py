"""A Hugging Face mixture of experts' experts spread over ranks with transformers' own expert-parallel
plan (the config's `base_model_ep_plan`: Qwen3-MoE, Mixtral, OLMoE and the other families that ship
one): each rank holds num_experts / expert of every layer's stacked expert weights (a DTensor split
along the experts, as transformers' `grouped_gemm` style makes it), and the experts module reaches
them through transformers' all-to-all dispatch (`ep_dispatch_experts`). The framework's part is the
rest of the layout: which ranks (framework/strategy/mesh/dims.py), FSDP2 over everything but the
experts, the experts' gradient over their replicas (framework/strategy/mesh/experts.py), and the
checkpoint under the model's own names.

transformers imports only here, when such a model is spread.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version

import torch
from torch import nn

SINCE = "5.24"  # the first transformers whose apply_expert_parallelism this module was verified against


def installed() -> str:
    try:
        return version("transformers")
    except PackageNotFoundError:
        return "none"


def supported() -> bool:
    """Whether the installed transformers has the expert-parallel API used here (SINCE or newer)."""
    found = installed()
    if found == "none":
        return False
    parts = [int(p) if p.isdigit() else 0 for p in re.split(r"[.+-]", found)[:2]]
    return tuple(parts) >= tuple(int(p) for p in SINCE.split("."))


def plan_of(model: nn.Module) -> dict[str, str] | None:
    """The model config's expert-parallel plan (transformers' names, relative to its base model), or
    None where its family ships none."""
    plan = getattr(getattr(model, "config", None), "base_model_ep_plan", None)
    return dict(plan) if plan else None


def expert_modules(model: nn.Module) -> list[nn.Module]:
    """The model's stacked-experts modules (transformers' naming: a class ending in Experts, with
    num_experts)."""
    return [m for m in model.modules() if type(m).__name__.endswith("Experts") and getattr(m, "num_experts", None)]


def sizes(model: nn.Module) -> tuple[int, int, float]:
    """(experts per layer, the model's width, the share of them a token goes through), from its config."""
    config = getattr(model, "config", None)
    experts = int(getattr(config, "num_local_experts", None) or getattr(config, "num_experts", 0) or 0)
    top_k = int(getattr(config, "num_experts_per_tok", 0) or 0)
    return experts, int(getattr(config, "hidden_size", 0) or 0), top_k / max(experts, 1)


def concrete_plan(model: nn.Module, plan: dict[str, str]) -> dict[str, str]:
    """The plan's patterns ('layers.*.mlp.experts.gate_up_proj') as the model's own names, every
    parameter's entry before its module's (a module's dispatch reads the experts it keeps)."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    names = [n for n, _ in model.named_parameters()], [n for n, _ in model.named_modules()]
    found: dict[str, str] = {}
    for kind in names:
        for pattern, style in plan.items():
            full = re.compile(r"(?:" + re.escape(prefix) + r"\.)?" + re.escape(pattern).replace(r"\*", r"\d+") + "$")
            found.update({name: style for name in kind if full.fullmatch(name)})
    return found


def expert_weights(model: nn.Module) -> list[nn.Parameter]:
    """The stacked expert weights the plan spreads (FSDP2 leaves them to the expert-parallel ranks)."""
    plan = plan_of(model)
    if plan is None:
        return []
    params = dict(model.named_parameters())
    return [params[name] for name in concrete_plan(model, plan) if name in params]


def spread(model: nn.Module, ep_mesh, tp_mesh) -> list[nn.Parameter]:
    """Apply transformers' plan: each experts module's weights split over `ep_mesh` (1-D), its
    tokens dispatched by all-to-all; `tp_mesh` is the ranks computing the same tokens (size 1).
    Returns the spread weights."""
    from transformers.distributed.expert_parallel import apply_expert_parallelism

    for module in expert_modules(model):
        computing_in_input_dtype(module)
    apply_expert_parallelism(model, ep_mesh, tp_mesh, concrete_plan(model, plan_of(model)))
    return expert_weights(model)


class HubExperts:
    """A Hugging Face family's experts, as the expert-parallel applier sees a family of experts
    (framework/strategy/mesh/experts.py BuiltinExperts is the other)."""

    count_key = "model.config.num_experts (num_local_experts)"
    tensor_dim = True  # transformers' dispatch asks for an expert_tensor dimension, of size 1

    def __init__(self, model: nn.Module, modules: list[nn.Module]):
        self.model, self.layers = model, modules

    def problems(self, expert: int, tensor: int, pipeline: int) -> list[str]:
        name = type(self.model).__name__
        if plan_of(self.model) is None:
            return [f"strategy.expert_parallel_size={expert}: {name}'s family ships no expert-parallel plan "
                    "(its config's base_model_ep_plan) to spread its experts by; set expert_parallel_size=1 (fsdp "
                    "still shards them)."]
        if not supported():
            return [f"strategy.expert_parallel_size={expert} with a Hugging Face model ({name}) spreads its experts "
                    f"with transformers' own expert-parallel plan, which this framework uses from transformers {SINCE} "
                    f"on (installed: {installed()}); upgrade transformers, or set expert_parallel_size=1 (fsdp still "
                    "shards the experts)."]
        if tensor > 1 or pipeline > 1:
            return [f"strategy.expert_parallel_size={expert} with a Hugging Face model ({name}) takes data-parallel "
                    "ranks only: set strategy.tensor_parallel_size=1 and strategy.pipeline_parallel_size=1, or train "
                    "the built-in GPT's experts (model.moe), which spread under tensor parallelism and pipeline "
                    "stages too."]
        return []

    def counts(self) -> list[int]:
        return sorted({int(m.num_experts) for m in self.layers})

    def sizes(self) -> tuple[int, int, float]:
        return sizes(self.model)

    def weights(self) -> list[nn.Parameter]:
        return expert_weights(self.model)

    def spread(self, mesh, token_group) -> list[nn.Parameter]:
        """Over `mesh`'s expert dimension; the routers watched count their tokens over `token_group`
        (set by the applier on every routing module)."""
        return spread(self.model, mesh["expert"], mesh["expert_tensor"])


def computing_in_input_dtype(module: nn.Module) -> None:
    """The experts computed in their input's dtype: under FSDP's mixed precision, which leaves the
    spread experts alone, the tokens arrive in the compute dtype and the weights stay in theirs
    (the built-in GPT's experts cast alike: framework/models/moe.py)."""
    forward = module.forward

    def in_input_dtype(hidden_states, top_k_index, top_k_weights):
        with _params_as(module, hidden_states.dtype):
            return forward(hidden_states, top_k_index, top_k_weights)

    module.forward = in_input_dtype


@contextmanager
def _params_as(module: nn.Module, dtype: torch.dtype):
    swapped = {name: p for name, p in module._parameters.items() if p is not None and p.dtype != dtype}
    for name, p in swapped.items():
        module._parameters[name] = p.to(dtype)
    try:
        yield
    finally:
        module._parameters.update(swapped)
