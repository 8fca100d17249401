"""torch's Adam and AdamW switched to their fused kernel under DeepSpeed (DeepSpeedStrategy.setup)."""
from __future__ import annotations

import torch


def use_fused_adam(optimizer) -> bool:
    """Switch a torch Adam/AdamW whose `fused` was left unset to its fused kernel, which updates
    in place (DeepSpeed hands it one flat partition per group, over which the default loop makes
    partition-sized temporaries). Returns whether it switched."""
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW) or optimizer.defaults.get("fused") is not None:
        return False
    if optimizer.defaults.get("foreach") or optimizer.defaults.get("differentiable"):
        return False
    for group in optimizer.param_groups:
        if any(not p.is_floating_point() for p in group["params"]):
            return False
    optimizer.defaults["fused"] = True
    for group in optimizer.param_groups:
        group["fused"] = True
    return True
