"""`task.loss_chunk_tokens`: the next-token loss without the whole logits.

The logits of a long sequence are the largest tensor of a step (32k tokens x a 150k vocabulary:
19 GB in float32, and as much again for their gradient). Here the model's output head computes,
inside the model's own forward, each token's cross-entropy a chunk of tokens at a time: the chunk's
logits are made, scored and dropped; backward makes them again chunk by chunk (activation
checkpointing of the projection and the loss), so a step holds one chunk's logits at a time. The
model returns the per-token losses (B, T) in place of the logits, which the language-model task
sums as it sums the plain loss: the same loss and gradients (tests/tasks/test_chunked_loss.py).
A chunk's scorer may be any function of its logits (`scored_by`): distillation's scores each chunk
against the teacher's logits of the same positions, made from the teacher's hidden states and head
captured in its own forward (`capturing`; framework/tasks/distillation.py).

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

#: a head's scorer that returns the head's input itself (a frozen teacher's hidden states, with
#: its projection's weights: `capturing`)
CAPTURE = "capture"


def _chunk_scores(head: nn.Linear, hidden: torch.Tensor, start: int, score) -> torch.Tensor:
    """One chunk's scores: its logits made from `hidden` (positions start...) and scored, float32."""
    return score(F.linear(hidden, head.weight, head.bias), start, start + hidden.shape[0])


def _chunked_forward(self: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    score = getattr(self, "_chunk_score", None)
    if score is None:
        return F.linear(hidden, self.weight, self.bias)
    if score == CAPTURE:  # inside the forward the projection's weights are whole (gathered) under every strategy
        weight = self.weight.full_tensor() if hasattr(self.weight, "full_tensor") else self.weight
        bias = self.bias.full_tensor() if hasattr(self.bias, "full_tensor") else self.bias
        self._captured = (weight.detach().clone(), None if bias is None else bias.detach().clone())
        return hidden
    shape = hidden.shape[:-1]
    flat = hidden.reshape(-1, hidden.shape[-1])
    if self._chunk_positions != flat.shape[0]:
        raise ValueError(f"task.loss_chunk_tokens: {self._chunk_positions} targets for {flat.shape[0]} positions")
    size = self._loss_chunk_tokens
    pieces = []
    for start in range(0, flat.shape[0], size):
        chunk = flat[start:start + size]
        if torch.is_grad_enabled():  # backward makes the chunk's logits again instead of keeping them
            pieces.append(checkpoint(_chunk_scores, self, chunk, start, score, use_reentrant=False))
        else:
            pieces.append(_chunk_scores(self, chunk, start, score))
    scores = torch.cat(pieces)
    return scores.view(*shape, *scores.shape[1:])


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
def scored_by(head: nn.Linear, score, positions: int):
    """While the model runs, its head returns `score(logits of positions a..b, a, b)` for each chunk
    of its `positions` (flattened B x T) instead of the logits, concatenated in position order
    (each chunk's values (n,) or (n, k): the model's output then (B, T) or (B, T, k))."""
    head._chunk_score, head._chunk_positions = score, positions
    try:
        yield
    finally:
        head._chunk_score = head._chunk_positions = None


def scoring(head: nn.Linear, targets: torch.Tensor):
    """While the model runs, its head returns each position's loss against `targets` (B, T),
    aligned with the positions (-100: not scored), instead of the logits."""
    goal = targets.reshape(-1)

    def cross_entropy(logits: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        return F.cross_entropy(logits.float(), goal[start:stop], ignore_index=IGNORE_INDEX, reduction="none")

    return scored_by(head, cross_entropy, goal.shape[0])


@contextlib.contextmanager
def capturing(head: nn.Linear):
    """While the model runs, its head returns its input (the hidden states) instead of the logits;
    after, `head._captured` holds (its weight, its bias) as they were inside the forward: whole,
    detached copies (a sharding strategy frees its gathered copy after the forward)."""
    head._chunk_score = CAPTURE
    try:
        yield
    finally:
        head._chunk_score = None
