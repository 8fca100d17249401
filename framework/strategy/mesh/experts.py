"""The expert-parallel applier: a mixture of experts' experts spread over `expert` ranks.

A model's mixture-of-experts layer (the built-in GPT's, framework/models/moe.py) is found by what
it holds: an `experts` module with `num_experts`, its weights stacked on a first dimension of
experts, and a `group` it dispatches over; and a `token_group`, the ranks its routing statistics
are counted over. The expert-parallel ranks are borrowed from the data-parallel shard dimension,
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

from framework.console import human_bytes
from framework.errors import ConfigError
from framework.strategy.mesh import hf_experts
from framework.strategy.mesh.applier import Applier

EXPERT_WEIGHTS = ("w1", "b1", "w2", "b2")


def expert_layers(model: nn.Module) -> list[nn.Module]:
    """The model's mixture-of-experts layers (see the module docstring for what marks one)."""
    return [m for m in model.modules()
            if hasattr(m, "token_group") and hasattr(getattr(m, "experts", None), "num_experts")]


def expert_problems(model: nn.Module | None, expert: int, tensor: int = 1, pipeline: int = 1) -> list[str]:
    """Why `expert` ranks cannot spread `model`'s experts (before launch), at `tensor` tensor-parallel
    ranks and `pipeline` stages."""
    if expert == 1 or model is None:
        return []
    layers = expert_layers(model)
    if not layers and hf_experts.expert_modules(model):
        return _hf_problems(model, expert, tensor, pipeline)
    if not layers:
        return [f"strategy.expert_parallel_size={expert}: {type(model).__name__} has no mixture-of-experts layers to "
                "spread; set model.moe.num_experts (the built-in GPT), or expert_parallel_size=1."]
    counts = sorted({layer.experts.num_experts for layer in layers})
    if any(n % expert for n in counts):
        return [f"strategy.expert_parallel_size={expert} does not divide the model's {counts[0]} experts per layer; "
                "choose a size that divides model.moe.num_experts."]
    return []


def _hf_problems(model: nn.Module, expert: int, tensor: int, pipeline: int) -> list[str]:
    name = type(model).__name__
    if hf_experts.plan_of(model) is None:
        return [f"strategy.expert_parallel_size={expert}: {name}'s family ships no expert-parallel plan "
                "(its config's base_model_ep_plan) to spread its experts by; set expert_parallel_size=1 (fsdp still "
                "shards them)."]
    if not hf_experts.supported():
        return [f"strategy.expert_parallel_size={expert} with a Hugging Face model ({name}) spreads its experts with "
                f"transformers' own expert-parallel plan, which this framework uses from transformers "
                f"{hf_experts.SINCE} on (installed: {hf_experts.installed()}); upgrade transformers, or set "
                "expert_parallel_size=1 (fsdp still shards the experts)."]
    if tensor > 1 or pipeline > 1:
        return [f"strategy.expert_parallel_size={expert} with a Hugging Face model ({name}) takes data-parallel "
                "ranks only: set strategy.tensor_parallel_size=1 and strategy.pipeline_parallel_size=1, or train the "
                "built-in GPT's experts (model.moe), which spread under tensor parallelism and pipeline stages too."]
    counts = sorted({int(m.num_experts) for m in hf_experts.expert_modules(model)})
    if any(n % expert for n in counts):
        return [f"strategy.expert_parallel_size={expert} does not divide the model's {counts[0]} experts per layer; "
                "choose a size that divides model.config.num_experts (num_local_experts)."]
    return []


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
    tensor parallelism: placements Replicate, Shard(0), Replicate); the layers dispatch over its
    expert dimension and count their tokens over `token_group` (the data-parallel ranks). A Hugging
    Face family's experts go by transformers' own plan over the expert dimension
    (framework/strategy/mesh/hf_experts.py)."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    params = []
    group = mesh.get_group("expert")
    placements = [Replicate(), Shard(0)] + [Replicate()] * (mesh.ndim - 2)
    for layer in expert_layers(model):
        experts = layer.experts
        for name in EXPERT_WEIGHTS:
            weight = getattr(experts, name)
            spread = nn.Parameter(distribute_tensor(weight.data, mesh, placements, src_data_rank=None),
                                  requires_grad=weight.requires_grad)
            experts.register_parameter(name, spread)
            params.append(spread)
        experts.group = group
        layer.token_group = token_group
    if not params and hf_experts.expert_modules(model):
        params = hf_experts.spread(model, mesh["expert"], mesh["expert_tensor"])
    if not params:
        raise ConfigError("strategy.expert_parallel_size: the model has no mixture-of-experts layers to spread.")
    replicas = mesh.size(0)
    return ExpertParallel(params, mesh.get_group("expert_replica") if replicas > 1 else None, data_parallel)


def expert_parameters(model: nn.Module) -> set[nn.Parameter]:
    """The experts' weights (FSDP2 leaves them to the expert-parallel applier)."""
    own = {getattr(layer.experts, name) for layer in expert_layers(model) for name in EXPERT_WEIGHTS}
    return own or set(hf_experts.expert_weights(model))


def trainable(model: nn.Module) -> int:
    """The experts' trainable parameters (spread over the expert-parallel ranks, each holding 1/E)."""
    return sum(p.numel() for p in expert_parameters(model) if p.requires_grad)


def routing_counted(model: nn.Module, counted: bool) -> None:
    """Whether every layer's forwards count their tokens for the bias balancing (a pipeline's
    metadata inference does not: framework/strategy/mesh/pipeline/run.py)."""
    for layer in expert_layers(model):
        layer.counting = counted


def token_groups(model: nn.Module, group) -> None:
    """Count every layer's routing statistics over `group` (the data-parallel ranks: under tensor
    parallelism or pipeline stages the world is not)."""
    for layer in expert_layers(model):
        layer.token_group = group


def describe(model: nn.Module, expert: int, tokens: int = 0, element_bytes: int = 4) -> str:
    """`plan`'s line: each rank's experts, and with `tokens` (a rank's tokens per step) the bytes a
    rank sends by all-to-all per step: each token's top-k copies to other ranks' experts and their
    outputs back, forward, and the same again in backward."""
    layers = expert_layers(model)
    if layers:
        n, width, fraction = layers[0].experts.num_experts, layers[0].experts.w1.shape[1], layers[0].experts.active_fraction
    else:  # a Hugging Face family's
        layers = hf_experts.expert_modules(model)
        n, width, fraction = hf_experts.sizes(model)
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

    def __init__(self, strategy, dims):
        super().__init__(strategy, dims)
        self.spread: ExpertParallel | None = None
        self.parameters: set = set()

    @classmethod
    def wanted(cls, strategy, dims) -> bool:
        return dims is not None and dims.expert > 1

    def problems(self, model):
        if model is None:
            return []
        if self.strategy.cpu_offload:
            return [f"strategy={self.strategy.name} with cpu_offload and expert_parallel_size={self.dims.expert}: the "
                    "experts are spread, not sharded by FSDP, and would stay on the device; drop one of them."]
        return expert_problems(model, self.dims.expert, self.dims.tensor, self.dims.pipeline)

    def lines(self, model):
        if self.strategy.pipeline is not None:
            return []  # the pipeline's lines say the mesh
        if model is None:
            return [f"mesh: {self.dims.describe()}"]
        loop = self.strategy.loop_settings
        tokens = loop.micro_batch_size * loop.accumulate * getattr(model, "block_size", 0)
        return [f"mesh: {self.dims.describe()}", describe(model, self.dims.expert, tokens)]

    def layout(self, layout, model):
        if model is None or self.strategy.pipeline is not None:  # a pipeline rank's count holds its experts
            return layout
        return replace(layout, spread_parameters=trainable(model), spread_ranks=self.dims.expert)

    def units(self, units, model):
        owned = expert_parameters(model)
        inside = [sum(p.numel() for p in unit.parameters() if p in owned) for unit in units.modules]
        return replace(units, gathered=[n - e for n, e in zip(units.gathered, inside + [0])])

    def apply(self, model):
        s, dims = self.strategy, self.dims
        # the tokens counted over the data-parallel ranks (not the tensor ranks or other stages)
        tokens = s.token_group() or "default"
        mesh = dims.build_expert_mesh(s.root_device.type, tensor_dim=not expert_layers(model))
        self.spread = apply_expert_parallel(model, mesh, tokens, dims.data_parallel)
        self.parameters = expert_parameters(model)
        s._say(f"{s.name}: {describe(model, dims.expert)}")

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
    def wanted(cls, strategy, dims) -> bool:
        return dims is not None and dims.expert == 1

    def apply(self, model):
        group = self.strategy.token_group()
        if group is not None:
            token_groups(model, None if group == "single" else group)
