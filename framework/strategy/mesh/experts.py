"""The expert-parallel applier: a mixture of experts' experts spread over `expert` ranks.

A model's experts are one of two families, decided once (`experts_of`): the built-in GPT's layers
(an ExpertLayer of framework/construction/routing.py, its StackedExperts' weights stacked on a
first dimension of experts, and a `group` they dispatch over), or a Hugging Face family's
(hf_experts.HubExperts, spread by transformers' own plan). Every routing module (Routed) counts its
statistics over a `token_group` the layout sets. The expert-parallel ranks are borrowed from the data-parallel shard dimension,
as torchtitan does: they read different batches, and each token goes to the rank holding its
expert and comes back (all-to-all). Each expert weight becomes a DTensor on an (expert_replica,
expert) mesh, split along its experts over `expert` and replicated over the rest, so a checkpoint
holds every expert under the model's own names and loads at any expert-parallel size.

FSDP2 leaves the experts alone (they are split already): their gradient, which each rank's
experts collect from the tokens of every rank of its expert group, is summed over the expert's
replicas and divided by the data-parallel ranks once a step (`finish_gradients`), as FSDP's
reduce-scatter averages the other parameters'.
"""
from __future__ import annotations

from dataclasses import replace

import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from framework.console import human_bytes
from framework.construction.routing import ExpertLayer, Routed
from framework.errors import ConfigError, indivisible
from framework.strategy.abilities import Abilities
from framework.strategy.mesh import hf_experts
from framework.strategy.mesh.applier import Applier


def build_expert_mesh(dims, device_type: str, tensor_dim: bool = False):
    """The experts' mesh: (expert_replica, expert[, expert_tensor]) within this rank's pipeline
    stage group. The expert groups are consecutive ranks of the shard dimension with the same
    tensor-parallel place (which compute the same tokens: each such slice dispatches on its
    own). `tensor_dim`: expert_tensor kept at size 1 too (transformers' dispatch asks for it)."""
    names = ("pipeline", "expert_replica", "expert", "expert_tensor")
    sizes = (dims.pipeline, dims.replicate * dims.shard // dims.expert, dims.expert, dims.tensor)
    always = ("expert_replica", "expert", "expert_tensor") if tensor_dim else ("expert_replica", "expert")
    kept = [i for i, n in enumerate(names) if n in always or sizes[i] > 1]
    mesh = init_device_mesh(device_type, tuple(sizes[i] for i in kept), mesh_dim_names=tuple(names[i] for i in kept))
    return mesh[tuple(n for n in names[1:] if n in mesh.mesh_dim_names)] if dims.pipeline > 1 else mesh


class BuiltinExperts:
    """The built-in GPT's mixture-of-experts layers (framework/models/moe.py), as the applier sees a
    family of experts (hf_experts.HubExperts is the other): why they cannot spread, their counts
    and sizes, their weights, and how they spread."""

    count_key = "model.moe.num_experts"
    tensor_dim = False

    def __init__(self, layers: list[ExpertLayer]):
        self.layers = layers

    def problems(self, expert: int, tensor: int, pipeline: int) -> list[str]:
        return []  # they spread under tensor parallelism and pipeline stages too

    def counts(self) -> list[int]:
        return sorted({layer.experts.num_experts for layer in self.layers})

    def sizes(self) -> tuple[int, int, float]:
        experts = self.layers[0].experts
        return experts.num_experts, experts.w1.shape[1], experts.active_fraction

    def weights(self) -> list[nn.Parameter]:
        return [w for layer in self.layers for w in layer.experts.weights()]

    def spread(self, mesh, token_group) -> list[nn.Parameter]:
        """Each stacked weight a DTensor on `mesh` (Replicate over expert_replica, Shard(0) over
        expert, Replicate over expert_tensor); the layers dispatch over its expert dimension."""
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        placements = [Replicate(), Shard(0)] + [Replicate()] * (mesh.ndim - 2)
        group, params = mesh.get_group("expert"), []
        for layer in self.layers:
            experts = layer.experts
            for name, weight in zip(experts.WEIGHTS, experts.weights()):
                spread = nn.Parameter(distribute_tensor(weight.data, mesh, placements, src_data_rank=None),
                                      requires_grad=weight.requires_grad)
                experts.register_parameter(name, spread)
                params.append(spread)
            experts.group = group
        return params


def experts_of(model: nn.Module) -> BuiltinExperts | hf_experts.HubExperts | None:
    """The family of `model`'s experts (the built-in GPT's layers, else a Hugging Face family's
    stacked experts), or None where it has none: decided here once."""
    layers = [m for m in model.modules() if isinstance(m, ExpertLayer)]
    if layers:
        return BuiltinExperts(layers)
    modules = hf_experts.expert_modules(model)
    return hf_experts.HubExperts(model, modules) if modules else None


def expert_problems(model: nn.Module | None, expert: int, tensor: int = 1, pipeline: int = 1) -> list[str]:
    """Why `expert` ranks cannot spread `model`'s experts (before launch), at `tensor` tensor-parallel
    ranks and `pipeline` stages."""
    if expert == 1 or model is None:
        return []
    family = experts_of(model)
    if family is None:
        return [f"strategy.expert_parallel_size={expert}: {type(model).__name__} has no mixture-of-experts layers to "
                "spread; set model.moe.num_experts (the built-in GPT), or expert_parallel_size=1."]
    problems = family.problems(expert, tensor, pipeline)
    for n in family.counts():  # one message: the first count it does not divide
        problems = problems or indivisible(f"strategy.expert_parallel_size={expert}", expert, n,
                                           f"the model's {n} experts per layer",
                                           f"choose a size that divides {family.count_key}.")
    return problems


class ExpertParallel:
    """What the applier set up, for the step's gradient finish."""

    def __init__(self, params: list[nn.Parameter], replica_group, data_parallel: int):
        self.params, self.replica_group, self.data_parallel = params, replica_group, data_parallel
        self.finished = False

    def finish_gradients(self) -> None:
        """Once a step, before clipping: each expert's gradient summed over its replicas and divided
        by the data-parallel ranks (the step's mean, as for every other parameter)."""
        if self.finished:
            return
        self.finished = True
        for param in self.params:
            if param.grad is None:
                continue
            local = param.grad.to_local()
            if self.replica_group is not None:
                dist.all_reduce(local, group=self.replica_group)
            local.div_(self.data_parallel)


def apply_expert_parallel(model: nn.Module, mesh, token_group, data_parallel: int) -> ExpertParallel:
    """Spread every layer's experts over `mesh` (dims expert_replica, expert, and expert_tensor under
    tensor parallelism: placements Replicate, Shard(0), Replicate); every routing module counts its
    tokens over `token_group` (the data-parallel ranks). A Hugging Face family's experts go by
    transformers' own plan over the expert dimension (framework/strategy/mesh/hf_experts.py)."""
    family = experts_of(model)
    if family is None:
        raise ConfigError("strategy.expert_parallel_size: the model has no mixture-of-experts layers to spread.")
    params = family.spread(mesh, token_group)
    token_groups(model, token_group)
    replicas = mesh.size(0)
    return ExpertParallel(params, mesh.get_group("expert_replica") if replicas > 1 else None, data_parallel)


def expert_parameters(model: nn.Module) -> set[nn.Parameter]:
    """The experts' weights (FSDP2 leaves them to the expert-parallel applier)."""
    family = experts_of(model)
    return set(family.weights()) if family is not None else set()


def trainable(model: nn.Module) -> int:
    """The experts' trainable parameters (spread over the expert-parallel ranks, each holding 1/E)."""
    return sum(p.numel() for p in expert_parameters(model) if p.requires_grad)


def _routed(model: nn.Module) -> list[Routed]:
    return [m for m in model.modules() if isinstance(m, Routed)]


def routing_counted(model: nn.Module, counted: bool) -> None:
    """Whether every routing module's forwards count their tokens for the bias balancing (a
    pipeline's metadata inference does not: framework/strategy/mesh/pipeline/run.py)."""
    for module in _routed(model):
        module.counting = counted


def token_groups(model: nn.Module, group) -> None:
    """Count every routing module's statistics over `group` (the data-parallel ranks: under tensor
    parallelism or pipeline stages the world is not)."""
    for module in _routed(model):
        module.token_group = group


def describe(model: nn.Module, expert: int, tokens: int = 0, element_bytes: int = 4) -> str:
    """`plan`'s line: each rank's experts, and with `tokens` (a rank's tokens per step) the bytes a
    rank sends by all-to-all per step: each token's top-k copies to other ranks' experts and their
    outputs back, forward, and the same again in backward."""
    family = experts_of(model)
    layers = family.layers if family is not None else []
    n, width, fraction = family.sizes() if family is not None else (0, 0, 0.0)
    line = (f"expert parallel: {expert} ranks, {n // max(expert, 1)} of {n} experts each in {len(layers)} "
            "mixture-of-experts layer(s); tokens travel to their experts by all-to-all")
    if not tokens or not layers or not width:
        return line
    copies = tokens * round(fraction * n)
    sent = 4 * copies * width * element_bytes * len(layers) * (expert - 1) / expert
    return line + f", about {human_bytes(sent)} sent per rank per step (even routing)"


class ExpertApplier(Applier):
    """A mixture of experts' experts spread over `expert` ranks borrowed from the shard dimension;
    FSDP leaves them alone, their gradients finished once a step (before clipping or stepping)."""

    norm_by_hand = True
    abilities = Abilities(collective_forward=True)  # tokens exchanged with the experts' ranks (all-to-all)

    def __init__(self, placement, dims):
        super().__init__(placement, dims)
        self.spread: ExpertParallel | None = None
        self.parameters: set = set()

    @classmethod
    def wanted(cls, placement, dims) -> bool:
        return dims is not None and dims.expert > 1

    def problems(self, model):
        if model is None:
            return []
        if self.placement.cpu_offload:
            return [f"strategy={self.placement.name} with cpu_offload and expert_parallel_size={self.dims.expert}: the "
                    "experts are spread, not sharded by FSDP, and would stay on the device; drop one of them."]
        return expert_problems(model, self.dims.expert, self.dims.tensor, self.dims.pipeline)

    def lines(self, model):
        if self.placement.pipeline is not None:
            return []  # the pipeline's lines say the mesh
        if model is None:
            return [f"mesh: {self.dims.describe()}"]
        loop = self.placement.loop_settings
        tokens = loop.micro_batch_size * loop.accumulate * getattr(model, "block_size", 0)
        return [f"mesh: {self.dims.describe()}", describe(model, self.dims.expert, tokens)]

    def layout(self, layout, model):
        if model is None or self.placement.pipeline is not None:  # a pipeline rank's count holds its experts
            return layout
        return replace(layout, spread_parameters=trainable(model), spread_ranks=self.dims.expert)

    def units(self, units, model):
        owned = expert_parameters(model)
        inside = [sum(p.numel() for p in unit.parameters() if p in owned) for unit in units.modules]
        return replace(units, gathered=[n - e for n, e in zip(units.gathered, inside + [0])])

    def apply(self, model):
        s, dims = self.placement, self.dims
        # the tokens counted over the data-parallel ranks (not the tensor ranks or other stages)
        tokens = s.token_group() or "default"
        mesh = build_expert_mesh(dims, s.root_device.type, tensor_dim=experts_of(model).tensor_dim)
        self.spread = apply_expert_parallel(model, mesh, tokens, dims.data_parallel)
        self.parameters = expert_parameters(model)
        s.say(f"{s.name}: {describe(model, dims.expert)}")

    def ignored_parameters(self):
        return self.parameters

    def before_clip(self, model):
        self.spread.finish_gradients()

    def before_step(self):
        self.spread.finish_gradients()

    def after_zero_grad(self):
        self.spread.finished = False


class RoutingApplier(Applier):
    """Without expert parallelism: a mixture of experts' routing statistics counted over the ranks
    that read different tokens, where those are not the whole world (tensor ranks and stages)."""

    @classmethod
    def wanted(cls, placement, dims) -> bool:
        return dims is not None and dims.expert == 1

    def apply(self, model):
        group = self.placement.token_group()
        if group is not None:
            token_groups(model, None if group == "single" else group)
