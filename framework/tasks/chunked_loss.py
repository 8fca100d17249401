"""`task.loss_chunk_tokens`: the next-token loss without the whole logits.

The logits of a long sequence are the largest tensor of a step (32k tokens x a 150k vocabulary:
19 GB in float32, and as much again for their gradient). Here the model's output head computes,
inside the model's own forward, each token's cross-entropy a chunk of tokens at a time: the chunk's
logits are made, scored and dropped; backward makes them again chunk by chunk (activation
checkpointing of the projection and the loss), so a step holds one chunk's logits at a time. The
model returns the per-token losses (B, T) in place of the logits, which the language-model task
sums as it sums the plain loss: the same loss and gradients (tests/tasks/test_chunked_loss.py).

The head is the model's own output layer (the built-in GPT's `head`, a Hugging Face model's
`get_output_embeddings()`), given a forward of its own on the instance, so its weights, their tying
to the embedding, their names in checkpoints and a sharding strategy's hold on them are unchanged;
without targets (generation, other uses) it is the plain projection.
"""
from __future__ import annotations

import contextlib
import types

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from framework.errors import ConfigError
from framework.sequences import IGNORE_INDEX


def _chunk_losses(head: nn.Linear, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each token's cross-entropy for one chunk (float32; 0 where the target is -100)."""
    logits = F.linear(hidden, head.weight, head.bias)
    return F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="none")


def _chunked_forward(self: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    targets = getattr(self, "_loss_targets", None)
    if targets is None:
        return F.linear(hidden, self.weight, self.bias)
    shape = hidden.shape[:-1]
    flat, goal = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    if goal.shape[0] != flat.shape[0]:
        raise ValueError(f"task.loss_chunk_tokens: {goal.shape[0]} targets for {flat.shape[0]} positions")
    size = self._loss_chunk_tokens
    pieces = []
    for start in range(0, flat.shape[0], size):
        chunk, wanted = flat[start:start + size], goal[start:start + size]
        if torch.is_grad_enabled():  # backward makes the chunk's logits again instead of keeping them
            pieces.append(checkpoint(_chunk_losses, self, chunk, wanted, use_reentrant=False))
        else:
            pieces.append(_chunk_losses(self, chunk, wanted))
    return torch.cat(pieces).view(shape)


def output_head(model: nn.Module) -> nn.Linear:
    """The model's output projection: a Hugging Face model's get_output_embeddings(), else a Linear
    named `head` (the built-in GPT); refused, naming the key, when it has neither."""
    inner = model
    for _ in range(4):  # through the strategies' wrappers (DDP's and DeepSpeed's .module)
        if hasattr(inner, "get_output_embeddings") or isinstance(getattr(inner, "head", None), nn.Linear):
            break
        inner = getattr(inner, "module", inner)
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else getattr(inner, "head", None)
    if not isinstance(head, nn.Linear):
        raise ConfigError(f"task.loss_chunk_tokens: {type(inner).__name__} has no output head the framework can chunk "
                          "(a Linear named `head`, as the built-in GPT's, or a Hugging Face model's "
                          "get_output_embeddings()); set task.loss_chunk_tokens=null.")
    return head


def chunked_head(model: nn.Module, chunk_tokens: int) -> nn.Linear:
    """The model's output head, given the chunked forward once (idempotent)."""
    head = output_head(model)
    if getattr(head, "_loss_chunk_tokens", None) != chunk_tokens:
        head._loss_chunk_tokens = chunk_tokens
        head.forward = types.MethodType(_chunked_forward, head)
    return head


@contextlib.contextmanager
def scoring(head: nn.Linear, targets: torch.Tensor):
    """While the model runs, its head returns each position's loss against `targets` (B, T),
    aligned with the positions (-100: not scored), instead of the logits."""
    head._loss_targets = targets
    try:
        yield
    finally:
        head._loss_targets = None
