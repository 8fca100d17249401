"""The context-parallel applier: every sequence of a batch split over `context` ranks.

The ranks of a context group read the same batch (as tensor-parallel ranks do) and each keeps 2 of
its 2C chunks along the sequence (a head and a tail: framework/strategy/mesh/context_attention.py),
so a layer's activations on a rank are 1/C of the sequence's. The batch is split after the labels
are shifted (each position keeps its own next token, also the last of a chunk), its positions are
the global ones (position embeddings and RoPE see where a token really is), and attention sees the
whole sequence through an all-gather of keys and values. A padded batch whose longest row is not a
multiple of 2C positions is padded on after every real token (labels -100, keys masked, positions
counting on): causal attention never reads them and they score nothing. The loss of a rank is the
sum over its positions; the loop's scale (framework/loop/fit_loop.py) divides by the step's scored tokens, and
FSDP, which shards over the data-parallel x context ranks, averages the gradients over both, so a
rank's sum is weighted by the context size once more (`loss_weight`).

What it composes with: fsdp, hsdp and tensor parallelism (on the mesh: replicate, shard, context,
tensor). Refused with the reason, by rows of the compatibility table (framework/config/compatibility.py),
and for the model here: pipeline stages (a stage passes one tensor to the next: the
positions and the split would have to travel with it), expert parallelism (its token groups are
the shard ranks'), torch.compile (the attention's interception is not traced), `framework
predict` (a row's loss would be split over the ranks), tasks that are not a language model's.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from framework.batch_split import BatchSplit, cut_sequence
from framework.errors import ConfigError
from framework.strategy.abilities import Abilities
from framework.strategy.mesh.applier import Applier
from framework.strategy.mesh.context_attention import ContextAttention, SequenceShard


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's attention modules: those whose class name ends in Attention and that hold no
    other (the built-in GPT's CausalSelfAttention, transformers' LlamaAttention, GPT2Attention...)."""
    found = [m for m in model.modules() if type(m).__name__.endswith("Attention")]
    return [m for m in found if not any(o is not m and type(o).__name__.endswith("Attention") for o in m.modules())]


class ContextApplier(Applier):
    """Splits each batch's sequences over the context group and makes attention see all of them."""

    abilities = Abilities(collective_forward=True)  # attention gathers the group's keys and values

    def __init__(self, placement, dims):
        super().__init__(placement, dims)
        self.size = dims.context
        self.group = None
        self.rank = 0
        self.current: SequenceShard | None = None

    @classmethod
    def wanted(cls, placement, dims) -> bool:
        return dims is not None and dims.context > 1

    @property
    def loss_weight(self) -> int:
        """How much a rank's summed loss is weighted: FSDP averages gradients over the context ranks
        too, whose sums are parts of one batch's."""
        return self.size

    # ---- before launch ---------------------------------------------------------------------------
    def problems(self, model):
        """What the model cannot do under it (the combinations of settings it refuses are rows of
        framework/config/compatibility.py)."""
        return self._model_problems(model, f"strategy.context_parallel_size={self.size}") if model is not None else []

    @staticmethod
    def _model_problems(model: torch.nn.Module, key: str) -> list[str]:
        name = type(model).__name__
        config = getattr(model, "config", None)
        implementation = getattr(config, "_attn_implementation", "sdpa") if config is not None else "sdpa"
        if implementation != "sdpa":
            return [f"{key} with {name}'s attn_implementation={implementation}: the split attention intercepts "
                    "torch's scaled_dot_product_attention, which only the sdpa implementation calls; set "
                    "model.attn_implementation=sdpa."]
        if not attention_modules(model):
            return [f"{key}: {name} has no attention module (a module whose class name ends in Attention) to split "
                    "the sequence of; context parallelism needs a transformer's causal self-attention."]
        return []

    def lines(self, model):
        tokens = self.placement.loop_settings.sequence_length or 0
        share = f"{tokens // self.size:,} of {tokens:,} positions" if tokens else f"1/{self.size} of each sequence"
        return [f"context parallel: {self.dims.describe()}; every sequence split over {self.size} ranks ({share} each, "
                f"a head and a tail chunk); attention all-gathers the keys and values; activations per rank / "
                f"{self.size}"]

    def layout(self, layout, model):
        return replace(layout, activation_share=layout.activation_share / self.size)

    # ---- in the workers --------------------------------------------------------------------------
    def apply(self, model):
        """Make every attention module of `model` attend over the whole sequence."""
        self.group = self.placement.mesh["context"].get_group()
        self.rank = self.placement.mesh["context"].get_local_rank()
        modules = attention_modules(model)
        for module in modules:
            _intercept(module, lambda: self.current)
        s = self.placement
        s.say(f"{s.name}: {self.dims.describe()}; {len(modules)} attention modules ({type(modules[0]).__name__}) see "
               "the whole sequence")

    def split_batch(self, batch):
        share, self.current = split_batch(batch, self.placement.loop_settings.batch_split, self.size, self.rank,
                                          self.group)
        return share


def split_batch(batch, split: BatchSplit, size: int, rank: int, group=None) -> tuple[dict, SequenceShard]:
    """Rank `rank`'s share of a batch over a context group of `size` (as the task's `split` allows:
    framework/batch_split.py), and the shard its attention reads (documents of packed rows, real
    keys of padded rows)."""
    cut = cut_sequence(batch, split, 2 * size)
    shard = SequenceShard(group, size, rank, cut.length, cut.documents, cut.mask)
    return {name: shard.split(field) for name, field in cut.fields.items()}, shard


def _intercept(module: torch.nn.Module, current) -> None:
    """Run `module`'s forward under ContextAttention (on its instance: activation checkpointing's
    recomputation calls the same forward)."""
    original = module.forward
    kv_groups = int(getattr(module, "num_key_value_groups", 1))  # transformers' grouped-query attention

    def forward(*args, **kwargs):
        with ContextAttention(current, kv_groups) as mode:
            out = original(*args, **kwargs)
        if mode.calls == 0 and current() is not None:
            raise ConfigError(f"strategy.context_parallel_size: {type(module).__name__} computed attention without "
                              "torch's scaled_dot_product_attention, so it saw only this rank's part of the "
                              "sequence; use an attention implementation that calls it (model.attn_implementation="
                              "sdpa), or strategy.context_parallel_size=1.")
        return out

    module.forward = forward
