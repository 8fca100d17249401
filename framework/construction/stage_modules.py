"""One pipeline stage of a model, as a module of its own whose parameter names are the whole
model's (`blocks.5.attn.qkv.weight` on whichever stage holds block 5): a checkpoint written by the
stages together is the unsplit model's, and loads at any number of stages.

The stage keeps the model's own submodules (no copy), except a tied head: the last stage holds its
own copy of the embedding it is tied to, whose gradient the pipeline strategy adds to the first
stage's (as Megatron does), so the two stay equal.
"""
from __future__ import annotations

import torch
from torch import nn


class GPTStage(nn.Module):
    """Layers `layers` of a framework GPT; the first stage embeds the tokens, the last applies the
    final norm and the head. Its input and output are a tensor each, as torch's PipelineStage
    passes between stages: token ids into the first stage, activations between, logits out of the
    last."""

    def __init__(self, gpt: nn.Module, layers: range, first: bool, last: bool):
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
                self.head = head
        self.tied_copy = last and not first and self.head is not gpt.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.drop(self.tok_emb(x) + self.pos_emb(positions))
        for block in self.blocks.values():
            x = block(x)
        if self.last:
            x = self.head(self.ln_f(x))
        return x


def gpt_stages(gpt: nn.Module, split: list[range]) -> list[GPTStage]:
    """Every stage of `gpt` under `split` (framework/construction/stages.py), in order."""
    return [GPTStage(gpt, layers, first=i == 0, last=i == len(split) - 1) for i, layers in enumerate(split)]
