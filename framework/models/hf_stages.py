"""Pipeline stages of Hugging Face causal LMs (strategy=pipeline): the decoder families whose
layers are a ModuleList under the base model (Llama, Qwen2, Mistral and their kin: `model.layers`;
GPT-2: `transformer.h`), each stage a module whose parameter names are the whole model's
(framework/construction/stage_modules.py). The first stage embeds the tokens (GPT-2: and their
positions), every stage holds the rotary embedding its layers take, the last applies the final norm
and the head; a head tied to the embedding on another stage is a copy (its gradient summed by the
strategy). Attention stays causal: sdpa without a mask (as transformers calls it for unpadded
rows), another implementation with the causal mask it would build.
"""
from __future__ import annotations

import torch
from torch import nn

# the base model's layer list, what comes before it on the first stage, and its final norm
_FAMILIES = (("layers", ("embed_tokens", "rotary_emb"), "norm"),  # Llama, Qwen2, Mistral, ...
             ("h", ("wte", "wpe", "drop"), "ln_f"))  # GPT-2


def _family(lm: nn.Module):
    base = getattr(lm, getattr(lm, "base_model_prefix", ""), None)
    for layers, before, norm in _FAMILIES:
        if isinstance(getattr(base, layers, None), nn.ModuleList) and hasattr(base, norm) and hasattr(lm, "lm_head"):
            return base, layers, before, norm
    return None


def add_pipeline_stages(lm: nn.Module) -> nn.Module:
    """`lm` with `pipeline_layers` and `pipeline_stage` where its family is known (else unchanged:
    strategy=pipeline then refuses it, saying how to name its layers)."""
    if _family(lm) is not None:
        base, layers, _, _ = _family(lm)
        lm.pipeline_layers = f"{lm.base_model_prefix}.{layers}"
        lm.pipeline_stage = lambda indices, first, last: DecoderStage(lm, indices, first, last)
    return lm


class DecoderStage(nn.Module):
    """Layers `indices` of a Hugging Face decoder, under the whole model's names."""

    def __init__(self, lm: nn.Module, indices, first: bool, last: bool):
        super().__init__()
        base, layers_name, before, norm_name = _family(lm)
        self.first, self.last = first, last
        self.base_name, self.layers_name, self.norm_name = lm.base_model_prefix, layers_name, norm_name
        holder = nn.Module()
        self.add_module(self.base_name, holder)
        for name in before:  # the embeddings on the first stage; a rotary embedding on every stage
            if hasattr(base, name) and (first or name == "rotary_emb"):
                holder.add_module(name, getattr(base, name))
        sequence = getattr(base, layers_name)
        holder.add_module(layers_name, nn.ModuleDict({str(i): sequence[i] for i in indices}))
        embedding = lm.get_input_embeddings().weight
        tied = lm.lm_head.weight is embedding
        if last:
            holder.add_module(norm_name, getattr(base, norm_name))
            self.lm_head = lm.lm_head
            if tied and not first:  # its own copy, kept equal by the strategy
                head = nn.Linear(lm.lm_head.in_features, lm.lm_head.out_features, bias=False, device=embedding.device,
                                 dtype=embedding.dtype)
                with torch.no_grad():
                    head.weight.copy_(embedding)
                head.weight.requires_grad_(embedding.requires_grad)
                self.lm_head = head
        embedding_name = next(n for n, p in lm.named_parameters() if p is embedding)
        self.tied_names = (embedding_name, "lm_head.weight") if tied else None
        self.tied_copy = tied and last and not first
        self.sdpa = getattr(lm.config, "_attn_implementation", None) == "sdpa"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        holder = getattr(self, self.base_name)
        length = x.shape[1]
        positions = torch.arange(length, device=x.device)[None]
        if self.first:
            x = holder.drop(holder.wte(x) + holder.wpe(positions)) if hasattr(holder, "wte") else holder.embed_tokens(x)
        mask = None
        if not self.sdpa:  # the additive causal mask transformers builds for eager attention
            mask = torch.full((length, length), torch.finfo(x.dtype).min, device=x.device, dtype=x.dtype).triu(1)
            mask = mask[None, None]
        kwargs = {"attention_mask": mask}
        if hasattr(holder, "rotary_emb"):
            kwargs.update(position_ids=positions, position_embeddings=holder.rotary_emb(x, positions))
        for layer in getattr(holder, self.layers_name).values():
            out = layer(x, **kwargs)
            x = out[0] if isinstance(out, tuple) else out
        if self.last:
            x = self.lm_head(getattr(holder, self.norm_name)(x))
        return x
