"""The FLOPs one training step spends per item (token or sample), counted from the model as built:
what `train/mfu` multiplies the throughput by.

The count is the usual one (Kaplan et al. 2020; PaLM's appendix B): a matrix product's weight costs
2 FLOPs per item forward and 4 backward (the input's gradient and the weight's), 2 + 2 for a frozen
weight (no weight gradient: LoRA's base); attention's score and value products add 12 x layers x
width x context per token. Embedding lookups, norms and activations are left out (a few percent),
recomputation too (activation checkpointing: the model FLOPs, not the hardware's). A model with
layers the count does not cover (convolutions, a task that steps its optimizers itself) has none.
"""
from __future__ import annotations

import torch
from torch import nn

# leaf modules whose parameters do no matrix product (lookups, norms): counted as nothing
_FREE = ("Embedding", "Norm", "Dropout")


def _weight_elements(weight) -> int:
    """Elements of a (possibly sharded or quantized) weight as the model uses it."""
    state = getattr(weight, "quant_state", None)  # bitsandbytes 4-bit: packed storage
    if state is not None and getattr(state, "shape", None) is not None:
        return int(torch.Size(state.shape).numel())
    return int(getattr(weight, "ds_numel", 0) or weight.numel())  # DeepSpeed ZeRO-3 partitions to 0; DTensor: global


def matmul_weights(model: nn.Module) -> tuple[int, int] | None:
    """(trainable, frozen) elements of the weights that multiply activations (nn.Linear and its
    quantized and LoRA kinds, transformers' Conv1D; a tied head counts as the head; a mixture of
    experts' stacked expert weights by the share a token goes through), or None where
    some other layer holds parameters the count cannot price."""
    trainable = frozen = 0
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        if not own:
            continue
        kind = type(module).__name__
        fraction = getattr(module, "active_fraction", None)
        if fraction is not None:  # a mixture of experts' stacked experts: a token goes through `fraction` of them
            for p in own:
                if p.dim() >= 3:
                    count = int(_weight_elements(p) * fraction)
                    trainable, frozen = (trainable + count, frozen) if p.requires_grad else (trainable, frozen + count)
            continue
        if isinstance(module, nn.Linear) or kind == "Conv1D" or kind.lower().endswith("router"):  # a router: a Linear
            for p in own:
                if p.dim() < 2 and p is not getattr(module, "weight", None):
                    continue  # a bias: an addition, not a product
                if p.requires_grad:
                    trainable += _weight_elements(p)
                else:
                    frozen += _weight_elements(p)
        elif not any(part in kind for part in _FREE):
            if all(p.dim() < 2 for p in own):
                continue  # a scale or bias vector of some module (a LoRA wrapper's, a norm's)
            return None
    return trainable, frozen


def attention_shape(model: nn.Module) -> tuple[int, int] | None:
    """(layers, attention width) of a transformer: the framework's GPT or a transformers model's
    config; None for a model without attention."""
    blocks = getattr(model, "blocks", None)
    if blocks is not None and len(blocks) and hasattr(blocks[0], "attn"):
        return len(blocks), blocks[0].attn.qkv.out_features // 3  # query, key and value fused
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    if layers and heads and hidden:
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        return int(layers), int(heads * head_dim)
    return None


def key_value_shape(model: nn.Module) -> tuple[int, int] | None:
    """(layers, width of the keys, as of the values) a KV cache holds per position: the attention
    width, narrower where fewer key-value heads serve the query heads (a transformers config's
    num_key_value_heads); None for a model without attention."""
    shape = attention_shape(model)
    if shape is None:
        return None
    config = getattr(model, "config", None)
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    shared = getattr(config, "num_key_value_heads", None)
    layers, width = shape
    return (layers, width * shared // heads) if heads and shared else shape


def training_flops_per_item(model: nn.Module, context: int | None) -> float | None:
    """FLOPs of forward and backward per item: per token for a sequence model of `context`
    positions (attention included), per sample otherwise; None where not countable."""
    weights = matmul_weights(model)
    if weights is None:
        return None
    trainable, frozen = weights
    flops = 6.0 * trainable + 4.0 * frozen
    shape = attention_shape(model) if context else None
    if shape is not None:
        layers, width = shape
        flops += 12.0 * layers * width * context
    return flops
