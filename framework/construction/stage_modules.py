"""One pipeline stage of a model, as a module of its own whose parameter names are the whole
model's (`blocks.5.attn.qkv.weight` on whichever stage holds block 5): a checkpoint written by the
stages together is the unsplit model's, and loads at any number of stages.

A model says how it is cut: `pipeline_layers` names its sequence of repeated layers, and where its
forward does more than apply them in order, `pipeline_stage(layers, first, last)` builds one
stage (the built-in GPT: GPTStage below, with the embeddings first and the head last); otherwise a
stage is its layers in order (SequentialStage: the built-in MLP).

The stage keeps the model's own submodules (no copy), except a tied head: the last stage holds its
own copy of the embedding it is tied to, whose gradient the pipeline strategy adds to the first
stage's (as Megatron does), so the two stay equal. `RankPart` is what one rank holds.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from framework.construction.stages import balanced_split, explicit_split
from framework.errors import ConfigError


class GPTStage(nn.Module):
    """Layers `layers` of a framework GPT; the first stage embeds the tokens, the last applies the
    final norm and the head. Its input and output are a tensor each, as torch's PipelineStage
    passes between stages: token ids into the first stage, activations between, logits out of the
    last."""

    def __init__(self, gpt: nn.Module, layers, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.tok_emb, self.pos_emb, self.drop = gpt.tok_emb, gpt.pos_emb, gpt.drop
        self.blocks = nn.ModuleDict({str(i): gpt.blocks[i] for i in layers})
        if last:
            self.ln_f = gpt.ln_f
            self.head = gpt.head
            if not first and gpt.head.weight is gpt.tok_emb.weight:
                # tied, on another stage than the embedding: its own copy (kept equal by the strategy)
                head = nn.Linear(gpt.head.in_features, gpt.head.out_features, bias=False,
                                 device=gpt.head.weight.device, dtype=gpt.head.weight.dtype)
                with torch.no_grad():
                    head.weight.copy_(gpt.head.weight)
                head.weight.requires_grad_(gpt.head.weight.requires_grad)  # frozen under adapters, as its original
                self.head = head
        self.tied_copy = last and not first and self.head is not gpt.head
        #: (the embedding's name, the head's) where they are tied: the pipeline keeps them equal
        self.tied_names = ("tok_emb.weight", "head.weight") if gpt.head.weight is gpt.tok_emb.weight else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.drop(self.tok_emb(x) + self.pos_emb(positions))
        for block in self.blocks.values():
            x = block(x)
        if self.last:
            x = self.head(self.ln_f(x))
        return x


class SequentialStage(nn.Module):
    """Modules `indices` of a model whose forward is its `pipeline_layers` sequence applied in
    order (the built-in MLP's `net`), under the model's own names (`net.3.weight`; a dotted name
    such as `body.layers` gets holders of the same names)."""

    def __init__(self, model: nn.Module, indices: list[int], first: bool, last: bool):
        super().__init__()
        self.first, self.last, self.tied_copy, self.tied_names = first, last, False, None
        self.layers_name = model.pipeline_layers
        sequence = model.get_submodule(self.layers_name)
        *holders, name = self.layers_name.split(".")
        holder: nn.Module = self
        for part in holders:
            holder.add_module(part, nn.Module())
            holder = holder.get_submodule(part)
        holder.add_module(name, nn.ModuleDict({str(i): sequence[i] for i in indices}))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.get_submodule(self.layers_name).values():
            x = layer(x)
        return x


def how_to_split() -> str:
    return ("give the model class a `pipeline_layers` attribute naming the nn.ModuleList or nn.Sequential of its "
            "repeated layers, and, where its forward does more than apply them in order, a "
            "`pipeline_stage(layers, first, last)` method that builds the module of one stage (the built-in GPT "
            "and MLP: framework/models/)")


def pipeline_layers(model: nn.Module) -> nn.Module:
    """The sequence of layers the stages divide (the model's `pipeline_layers`: a submodule's name)."""
    name = getattr(model, "pipeline_layers", None)
    try:
        layers = model.get_submodule(name) if isinstance(name, str) else None
    except AttributeError:
        layers = None
    if not isinstance(layers, (nn.Sequential, nn.ModuleList)) or len(layers) == 0:
        raise ConfigError(f"strategy=pipeline: {type(model).__name__} has no sequence of layers the framework can "
                          f"split into stages; {how_to_split()}.")
    return layers


def _size(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def layer_groups(model: nn.Module) -> list[list[int]]:
    """The model's layers as the stages count them, each the indices of its modules in the
    sequence: a module with parameters and the parameter-free ones after it (an activation, a
    dropout), so a stage never starts with an MLP's ReLU."""
    groups: list[list[int]] = []
    for index, module in enumerate(pipeline_layers(model)):
        if groups and next(module.parameters(), None) is None:
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups


def stage_module(model: nn.Module, indices: list[int], first: bool, last: bool) -> nn.Module:
    """The module of one stage holding the layers `indices` of the model's sequence: the model's own
    `pipeline_stage` (what comes before and after the layers: a GPT's embeddings and head), else
    the layers in order."""
    own = getattr(model, "pipeline_stage", None)
    return own(indices, first, last) if own is not None else SequentialStage(model, indices, first, last)


def stage_extras(model: nn.Module) -> tuple[int, int]:
    """The parameters the first stage holds besides its layers (a GPT's embeddings) and the last (its
    final norm and head: a tied head counted as the copy it becomes)."""
    return _size(stage_module(model, [], True, False)), _size(stage_module(model, [], False, True))


def model_split(model: nn.Module, stages: int, layers_per_stage=None) -> list[range]:
    """The layers (layer_groups) of each of `stages` stages: as strategy.layers_per_stage names
    them, else balanced by parameters (framework/construction/stages.py)."""
    groups = layer_groups(model)
    if layers_per_stage is not None:
        return explicit_split(layers_per_stage, len(groups), stages)
    sequence = pipeline_layers(model)
    first, last = stage_extras(model)
    sizes = [sum(_size(sequence[i]) for i in group) for group in groups]
    return balanced_split(sizes, stages, first, last)


def model_stages(model: nn.Module, split: list[range]) -> list[nn.Module]:
    """Every stage of `model` under `split` (ranges of layer_groups), in order."""
    groups = layer_groups(model)
    return [stage_module(model, [i for g in layers for i in groups[g]], first=n == 0, last=n == len(split) - 1)
            for n, layers in enumerate(split)]


def _merge(target: nn.Module, source: nn.Module) -> None:
    """`source`'s submodules into `target` under the same names; containers (a ModuleDict of layers,
    a plain holder such as a Hugging Face stage's `model`) merged with those of the rank's other
    stages, a module two stages share (a rotary embedding) kept once."""
    for name, child in source.named_children():
        mine = target._modules.get(name)
        container = type(child) in (nn.Module, nn.ModuleDict)
        if mine is None:
            if container:
                mine = type(child)()
                target.add_module(name, mine)
                _merge(mine, child)
            else:
                target.add_module(name, child)
        elif container and mine is not child:
            _merge(mine, child)


class RankPart(nn.Module):
    """The stages one rank holds, as one module whose parameter names are the whole model's (its
    state dict is the model's for those layers; the ranks' parts together are the model's). The
    pipeline strategy trains the stages through torch's schedules; calling this module runs the
    whole model's forward across the ranks (`forward_fn`, set by the strategy: evaluation,
    prediction)."""

    def __init__(self, model: nn.Module, stages: dict[int, nn.Module], stage_count: int):
        super().__init__()
        for stage in stages.values():
            _merge(self, stage)
        object.__setattr__(self, "stages", dict(stages))  # not registered twice
        self.stage_count = stage_count
        self.sharding_units = getattr(model, "sharding_units", None)
        self._no_split_modules = getattr(model, "_no_split_modules", None)
        if hasattr(model, "peft_config"):  # adapters injected (framework/adapter/lora.py is_adapted)
            self.peft_config = model.peft_config
        #: what trains in the whole model, every stage's (an adapter run's checkpoint keeps those)
        self.whole_trainable_names = frozenset(name for name, p in model.named_parameters() if p.requires_grad)
        if hasattr(model, "pretrained_weights"):  # loaded into the stages after they are made (framework/trainer.py)
            self.pretrained_weights = model.pretrained_weights
        self.forward_fn: Callable | None = None

    @property
    def holds_first(self) -> bool:
        return 0 in self.stages

    @property
    def holds_last(self) -> bool:
        return self.stage_count - 1 in self.stages

    def tied_copies(self) -> dict[str, str]:
        """{a parameter of the first stage: this rank's copy of it on the last stage} (a tied head)."""
        last = self.stages.get(self.stage_count - 1)
        return dict([last.tied_names]) if getattr(last, "tied_copy", False) else {}

    def forward(self, *args, **kwargs):
        return self.forward_fn(*args, **kwargs)
