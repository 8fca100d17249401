"""Token log-probabilities: the one place a model's output becomes each position's log-probability
of its target token. The language model's loss is their negative (framework/tasks/language_modeling.py),
a preference pair's sequence log-probabilities their sums over the response (framework/tasks/preference.py),
the eval harness's continuations their sums and argmax (framework/generation/harness.py).

Two ways, the same numbers: from the whole logits (float32, log-softmax and pick: what
F.cross_entropy computes), or with `chunk_tokens` a chunk of positions at a time inside the model's
own output head, each chunk's logits made, scored and dropped (framework/tasks/chunked_loss.py), so a
step never holds the logits of a long sequence. A model that transforms its logits after the head
(Gemma 2's soft-capping, Cohere's logit scale, Granite's logits scaling) is refused for the chunked
way: the head's chunks would skip that transform.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.nn import functional as F

from framework.errors import ConfigError
from framework.sequences import IGNORE_INDEX
from framework.tasks.chunked_loss import chunked_head, scoring

#: config fields of transformers' families that change the logits after the output head (and the
#: value that leaves them as they are)
LOGIT_TRANSFORMS = {"final_logit_softcapping": None, "logit_scale": 1.0, "logits_scaling": 1.0,
                    "output_multiplier_scale": 1.0}


def output_logits(output) -> torch.Tensor:
    """The logits of a model's output: a tensor, output["logits"] or output.logits."""
    if isinstance(output, torch.Tensor):
        return output
    logits = output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits", None)
    if logits is None:
        raise ConfigError(f"task: the model returned a {type(output).__name__} without logits; a language model "
                          "must return logits (B, T, vocab) as a tensor, a dict with 'logits' or an object with "
                          ".logits.")
    return logits


def logps_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each position's log-probability of its target (targets' shape; 0 where it is -100), in float32,
    from logits (..., vocab)."""
    flat = logits.float().reshape(-1, logits.shape[-1])
    picked = F.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none")
    return -picked.view(targets.shape)


def check_chunkable(model: torch.nn.Module) -> None:
    """Refuse the chunked way for a model whose logits are transformed after its head."""
    inner = model
    for _ in range(4):  # through the strategies' wrappers (DDP's and DeepSpeed's .module)
        if getattr(inner, "config", None) is not None:
            break
        inner = getattr(inner, "module", inner)
    config = getattr(inner, "config", None)
    for field, plain in LOGIT_TRANSFORMS.items():
        value = getattr(config, field, plain)
        if value is not None and value != plain:
            family = getattr(config, "model_type", type(inner).__name__)
            raise ConfigError(f"task.loss_chunk_tokens: {family} transforms its logits after the output head "
                              f"({field}={value}), which the chunked head would skip, so its losses would not be "
                              "the model's; set task.loss_chunk_tokens=null.")


def _forward(model: torch.nn.Module, inputs):
    """The model on `inputs`: keywords (a dict batch's), or positional (a (tokens, targets) batch's
    tokens: a model of one's own may name its argument as it likes)."""
    return model(**inputs) if isinstance(inputs, Mapping) else model(*inputs)


def token_logps(model: torch.nn.Module, inputs, targets: torch.Tensor, chunk_tokens: int | None = None) -> torch.Tensor:
    """Each position's log-probability of its target (B, T; 0 where the target is -100) for the
    model's forward on `inputs` (keywords, or a tuple of positional arguments); `chunk_tokens`:
    through the chunked head, never the whole logits."""
    if chunk_tokens is None:
        return logps_of(output_logits(_forward(model, inputs)), targets)
    check_chunkable(model)
    with scoring(chunked_head(model, chunk_tokens), targets):
        losses = output_logits(_forward(model, inputs))
    return -losses.reshape(targets.shape)


def summed_nll(model: torch.nn.Module, inputs, targets: torch.Tensor, chunk_tokens: int | None = None) -> torch.Tensor:
    """The negative log-likelihood summed over the scored positions: F.cross_entropy's own sum over
    the whole logits (its summation order, so a step's loss is the same however the batch is cut),
    or the chunks' per-token losses summed."""
    if chunk_tokens is not None:
        return -token_logps(model, inputs, targets, chunk_tokens).sum()
    return summed_nll_of(output_logits(_forward(model, inputs)), targets)


def summed_nll_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The negative log-likelihood of `targets` under `logits` (..., vocab), summed over the scored
    positions in F.cross_entropy's own order (float32)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum")
