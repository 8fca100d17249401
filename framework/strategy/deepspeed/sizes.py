"""DeepSpeed's ZeRO sizes derived from the model, for the keys the user has not set.

DeepSpeed's defaults are sized for models of billions of parameters: 5e8-element reduce and
all-gather buckets (a 1 GB buffer in bf16 for a 100M model), and ZeRO-3's
`stage3_max_live_parameters` / `stage3_max_reuse_distance` of 1e9, which keep every parameter of
a smaller model gathered, so ZeRO-3 saves nothing. Here (h: the model's hidden size; U: the
most parameters one sharding unit gathers, framework/construction/units.py, at least h*h):

    reduce_bucket_size, allgather_bucket_size   h*h          (Hugging Face's "auto" value)
    stage3_prefetch_bucket_size                 0.9*h*h      (Hugging Face's "auto" value)
    stage3_param_persistence_threshold          10*h         (Hugging Face's "auto" value: biases
                                                              and norms stay gathered)
    stage3_max_live_parameters                  2*U          (the unit computing and the next)
    stage3_max_reuse_distance                   2*U
    sub_group_size                              U            (ZeRO-3 steps its optimizer one sub group
                                                              of partitions at a time and flattens
                                                              that group's gradients into a copy:
                                                              DeepSpeed's 1e9 makes the copy a whole
                                                              extra gradient partition at every step)

With NVMe offload (strategy=deepspeed_stage_3_offload_nvme) the swap buffers, which DeepSpeed
sizes for billion-parameter models (five parameter buffers of 1e8 elements, and the first 1e9
parameter elements kept in CPU memory, `max_in_cpu`), are sized to the model too (P: the most
elements of one parameter's partition on a rank, ceil(largest parameter / N)):

    offload_param.buffer_size       P      (each parameter swapped in takes one buffer)
    offload_param.buffer_count      5      (DeepSpeed's: a module's parameters and the prefetched)
    offload_param.max_in_cpu        0      (every partition lives in the NVMe folder, not in RAM)

so what stays in RAM is 5 P of parameter buffers, the optimizer swapper's buffer_count (4) sub
groups of fp32 state (U each) and one sub group's gradients, beside the float32 gradient
partition of every parameter (4 bytes per parameter / N), which DeepSpeed keeps in RAM
(framework/planning/memory.py counts them for `framework plan`).

Keys under `strategy.config.zero_optimization` always win.
"""
from __future__ import annotations

import math
from collections import Counter

from torch import nn

from framework.construction.units import choose_units


def hidden_size(model: nn.Module) -> int | None:
    """The model's hidden size: its config's (Hugging Face), else the most common input width of
    its linear layers (a transformer's d_model), else None."""
    config = getattr(model, "config", None)
    for key in ("hidden_size", "n_embd", "d_model"):
        value = getattr(config, key, None) or getattr(model, key, None)
        if isinstance(value, int) and value > 0:
            return value
    widths = Counter(m.in_features for m in model.modules() if isinstance(m, nn.Linear))
    return widths.most_common(1)[0][0] if widths else None


NVME_PARAM_BUFFERS = 5  # DeepSpeed's own count: a module's parameters and the next ones prefetched
NVME_OPTIMIZER_BUFFERS = 4  # DeepSpeed's own count: fp32 weights, two Adam states and the gradients of a sub group


def nvme_param_swap(model: nn.Module, world_size: int) -> dict:
    """`offload_param` sizes for NVMe: one buffer holds the largest parameter partition."""
    largest = max((p.numel() for p in model.parameters()), default=1)
    return {"buffer_size": math.ceil(largest / max(world_size, 1)), "buffer_count": NVME_PARAM_BUFFERS,
            "max_in_cpu": 0}


def zero_sizes(model: nn.Module, stage: int) -> dict:
    """`zero_optimization` keys sized to `model` (see the module docstring)."""
    h = hidden_size(model)
    sizes: dict = {}
    if h:
        sizes.update(reduce_bucket_size=h * h, allgather_bucket_size=h * h)
    if stage == 3:
        if h:
            sizes.update(stage3_prefetch_bucket_size=int(0.9 * h * h), stage3_param_persistence_threshold=10 * h)
        unit = max(choose_units(model).largest, h * h if h else 1)
        sizes.update(stage3_max_live_parameters=2 * unit, stage3_max_reuse_distance=2 * unit, sub_group_size=unit)
    return sizes
