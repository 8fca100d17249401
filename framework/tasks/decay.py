"""Which parameters weight decay applies to: transformers' Trainer's rule (and so trl's, and
nanoGPT's in effect): every parameter but biases and normalisation weights, which are left out (a
second parameter group with weight_decay 0). `trainer.decay_biases_and_norms=true` decays them all,
as a plain `torch.optim.AdamW(model.parameters())` does.

Left out: a parameter of a normalisation layer (torch's LayerNorm, RMSNorm, GroupNorm, batch and
instance norms), or one whose full name, lower-cased, holds `bias`, `layernorm`, `rmsnorm`, a `norm`
between dots or a name ending in `_norm` (transformers' patterns: a Hugging Face model's
`input_layernorm`, `model.norm`, `q_norm`).
"""
from __future__ import annotations

import re

import torch
from torch import nn

NO_DECAY_PATTERNS = tuple(re.compile(p) for p in (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)",
                                                   r"_norm(?:$|\.)"))
NORM_LAYERS = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase)


def no_decay_names(model: nn.Module) -> set[str]:
    """The names of `model`'s parameters that weight decay leaves out (module docstring)."""
    found = set()
    for module_name, module in model.named_modules():
        for name, _ in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            if isinstance(module, NORM_LAYERS) or any(p.search(full.lower()) for p in NO_DECAY_PATTERNS):
                found.add(full)
    return found


def decay_groups(factory, model: nn.Module):
    """An optimizer factory that splits the parameters it is given into those weight decay applies
    to and the rest (weight_decay 0), by their names in `model` (the model the strategy sets up:
    looked up when the optimizer is built, after the strategy has sharded or converted its
    parameters in place). Parameters it cannot name (a wrapper's flattened ones) and a list that is
    not plain parameters (groups already) go to `factory` unchanged."""
    def build_optimizer(params, *args, **kwargs) -> torch.optim.Optimizer:
        params = list(params)
        names = {id(p): n for n, p in model.named_parameters()}
        if not params or not all(isinstance(p, torch.Tensor) and id(p) in names for p in params):
            return factory(params, *args, **kwargs)
        left_out = no_decay_names(model)
        decayed = [p for p in params if names[id(p)] not in left_out]
        rest = [p for p in params if names[id(p)] in left_out]
        if not rest or not decayed:
            return factory(params if decayed else [{"params": rest, "weight_decay": 0.0}], *args, **kwargs)
        return factory([{"params": decayed}, {"params": rest, "weight_decay": 0.0}], *args, **kwargs)

    return build_optimizer
