"""A small GPT (decoder-only transformer), readable end to end."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from framework.config.types import NonNegativeFloat, PositiveInt
from framework.construction.stage_modules import GPTStage
from framework.errors import ConfigError
from framework.models.moe import MoE, MoESettings


class KVCache:
    """Every layer's keys and values of the positions seen so far, so that generating a token
    attends to them instead of recomputing the whole prefix (framework/generation/decode.py).
    Room for `capacity` positions, made at the first keys stored, in their heads, dtype and device
    (under tensor parallelism a rank holds its heads alone; under ZeRO-3 a weight's own shape says
    nothing of them); `length` counts the positions filled."""

    def __init__(self, n_layer: int, batch: int, capacity: int):
        self.n_layer, self.batch, self.capacity = n_layer, batch, capacity
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.length = 0

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one layer's keys and values of the new positions; returns those of every position."""
        if self.keys is None:
            shape = (self.n_layer, self.batch, k.shape[1], self.capacity, k.shape[3])
            self.keys = torch.zeros(shape, dtype=k.dtype, device=k.device)
            self.values = torch.zeros(shape, dtype=v.dtype, device=v.device)
        end = self.length + k.shape[2]
        self.keys[layer, :, :, self.length:end] = k
        self.values[layer, :, :, self.length:end] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]


def packed_mask(position_ids: torch.Tensor) -> torch.Tensor | None:
    """(B, 1, T, T), True where query t may attend to key s: s <= t within the same document, where
    a row packs several (a document starts where the positions restart: a position not above the
    one before it); None where no row does (plain causal attention). Positions that jump forward
    (a share of each sequence under context parallelism: framework/batch_split.py) do not start a
    document: the split attention masks by the whole sequence's documents itself."""
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] <= position_ids[:, :-1]
    if not bool(starts[:, 1:].any()):  # one read of the host: no (B, T, T) mask for rows of one document
        return None
    documents = starts.cumsum(dim=1)
    t = position_ids.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=position_ids.device).tril()
    return ((documents[:, :, None] == documents[:, None, :]) & causal)[:, None]


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.n_head = n_head
        self.head_dim = n_embd // n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.attn_drop = nn.Dropout(dropout)  # a module, so that a task that turns dropout off finds it
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """`mask` (B, 1, T, T), True where a position may attend (packed rows); None: causal."""
        qkv = self.qkv(x)  # under tensor parallelism: this rank's heads, all positions (framework/construction/tensor_parallel.py)
        b, t, _ = qkv.shape
        q, k, v = (z.view(b, t, -1, self.head_dim).transpose(1, 2) for z in qkv.chunk(3, dim=2))
        causal = mask is None
        if cache is not None and cache.length:  # new positions after cached ones: each sees the cache and
            k, v = cache.append(layer, k, v)    # the new positions up to itself
            causal = False
            if t > 1:
                mask = torch.ones(t, k.shape[2], dtype=torch.bool, device=x.device).tril(diagonal=cache.length)
        elif cache is not None:
            cache.append(layer, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                           dropout_p=self.attn_drop.p if self.training else 0.0)
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, t, -1)))


class Block(nn.Module):
    """One transformer layer (the unit that sharding strategies wrap): attention, then an MLP, or
    with `moe` a mixture of experts in its place (framework/models/moe.py)."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, moe: MoESettings | None = None, layer: int = 0):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln2 = nn.LayerNorm(n_embd)
        if moe is None:
            self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd),
                                     nn.Dropout(dropout))
        else:
            self.moe = MoE(n_embd, moe, dropout, layer)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), cache, layer, mask)
        return x + (self.moe if hasattr(self, "moe") else self.mlp)(self.ln2(x))


class GPT(nn.Module):
    """Token + position embeddings, `n_layer` Blocks, a final LayerNorm and a tied LM head."""

    #: the modules a sharding strategy wraps as units by default (strategy.wrap_modules=null)
    sharding_units = ("Block",)
    #: how strategy=model_parallel splits it (framework/construction/tensor_parallel.py): each rank
    #: computes its share of the heads and of the MLP's hidden units
    tensor_parallel_plan = {"blocks.*.attn.qkv": "colwise_fused3", "blocks.*.attn.proj": "rowwise",
                            "blocks.*.mlp.0": "colwise", "blocks.*.mlp.2": "rowwise"}
    #: with strategy.sequence_parallel=true: the blocks' norms (and the residual stream between
    #: the split layers) run on a share of the positions, gathered whole before the final norm
    sequence_parallel_plan = {"blocks.0": "split_sequence", "blocks.*.ln1": "sequence_parallel",
                              "blocks.*.ln2": "sequence_parallel", "ln_f": "gather_sequence"}

    #: what strategy=pipeline cuts into stages (framework/construction/stage_modules.py): the Blocks,
    #: the embeddings on the first stage, the final norm and head on the last (`pipeline_stage`)
    pipeline_layers = "blocks"
    def __init__(self, vocab_size: PositiveInt = 256, block_size: PositiveInt = 128, n_layer: PositiveInt = 4,
                 n_head: PositiveInt = 4, n_embd: PositiveInt = 128, dropout: NonNegativeFloat = 0.0,
                 moe: MoESettings | None = None):
        """vocab_size: tokens (256 for bytes); block_size: the longest context; n_layer: Blocks;
        n_head: attention heads (must divide n_embd); n_embd: width; dropout: probability; moe: the
        mixture-of-experts Blocks (framework/models/moe.py; null or num_experts 0: all dense)."""
        super().__init__()
        if n_embd % n_head:
            raise ConfigError(f"model.n_head={n_head} must divide model.n_embd={n_embd}.")
        self.block_size = block_size
        self.vocab_size = vocab_size  # the token ids it scores (a reference or teacher must share them)
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        moe = moe if moe is not None and moe.enabled else None
        self.moe_settings = moe
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout, moe if moe and moe.is_moe(i, n_layer) else None, i)
                                    for i in range(n_layer))
        if moe is not None:  # the split MLPs where there are any, the shared experts like them; the routed
            # experts whole on every tensor-parallel rank (expert parallelism spreads them instead)
            dense = any(hasattr(b, "mlp") for b in self.blocks)
            self.tensor_parallel_plan = {k: v for k, v in type(self).tensor_parallel_plan.items()
                                         if dense or ".mlp." not in k}
            if moe.shared_experts:
                self.tensor_parallel_plan.update({"blocks.*.moe.shared.0": "colwise", "blocks.*.moe.shared.2": "rowwise"})
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache: KVCache | None = None) -> torch.Tensor:
        """Logits (B, T, vocab). `attention_mask` (padded dict batches) needs no use: attention is
        causal and padding ends a row, so no real token attends to it (its labels are -100).
        `position_ids` (B, T): where each token sits (packed rows: a position not above the one
        before it starts a new sequence, which attends only to itself: `packed_mask`). `cache` (generation): input_ids are
        the positions after those cached, and are cached too."""
        t = input_ids.shape[1]
        start = cache.length if cache is not None else 0
        if start + t > self.block_size:
            raise ValueError(f"sequence of {start + t} tokens exceeds model.block_size={self.block_size}")
        mask = None
        if position_ids is not None:
            pos = position_ids
            mask = packed_mask(position_ids)
        else:
            pos = torch.arange(start, start + t, device=input_ids.device)
        x = self.drop(self.tok_emb(input_ids) + self.pos_emb(pos))
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer) if cache is not None else block(x, mask=mask)
        if cache is not None:
            cache.length += t
        return self.head(self.ln_f(x))

    def pipeline_stage(self, layers, first: bool, last: bool) -> nn.Module:
        """The module of one pipeline stage holding Blocks `layers` (framework/construction/stage_modules.py)."""
        return GPTStage(self, layers, first, last)

    def new_cache(self, batch: int = 1) -> KVCache:
        """An empty KV cache for `batch` sequences of up to block_size positions."""
        return KVCache(len(self.blocks), batch, self.block_size)
