"""A small GPT (decoder-only transformer), readable end to end."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from framework.config.types import NonNegativeFloat, PositiveInt
from framework.errors import ConfigError


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.dropout = dropout
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class Block(nn.Module):
    """One transformer layer (the unit that sharding strategies wrap)."""

    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token + position embeddings, `n_layer` Blocks, a final LayerNorm and a tied LM head."""

    #: the modules a sharding strategy wraps as units by default (strategy.wrap_modules=null)
    sharding_units = ("Block",)

    def __init__(self, vocab_size: PositiveInt = 256, block_size: PositiveInt = 128, n_layer: PositiveInt = 4,
                 n_head: PositiveInt = 4, n_embd: PositiveInt = 128, dropout: NonNegativeFloat = 0.0):
        """vocab_size: tokens (256 for bytes); block_size: the longest context; n_layer: Blocks;
        n_head: attention heads (must divide n_embd); n_embd: width; dropout: probability."""
        super().__init__()
        if n_embd % n_head:
            raise ConfigError(f"model.n_head={n_head} must divide model.n_embd={n_embd}.")
        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
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

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, vocab). `attention_mask` (padded dict batches) needs no use: attention is
        causal and padding ends a row, so no real token attends to it (its labels are -100)."""
        t = input_ids.shape[1]
        if t > self.block_size:
            raise ValueError(f"sequence of {t} tokens exceeds model.block_size={self.block_size}")
        pos = torch.arange(t, device=input_ids.device)
        x = self.drop(self.tok_emb(input_ids) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))
