"""Next-token prediction: cross-entropy, reported as loss and perplexity.

Two batch shapes are accepted:
- a pair `(tokens, next_tokens)` (the built-in data): the model is called as `model(tokens)`;
- a dict with `input_ids` and optionally `attention_mask` and `labels` (Hugging Face's
  convention, framework/data/text_files.py): the model is called with every key but `labels`, and
  position t predicts label t+1 (labels default to input_ids; -100 marks tokens not scored, e.g.
  padding); or a share of each row's positions, cut with its next-token labels shifted already
  (context parallelism: framework/batch_split.py says how).

The model may return logits (B, T, vocab) as a tensor, a dict with "logits", or an object with a
`.logits` attribute (a `transformers` ModelOutput).
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch.nn import functional as F

from framework.batch_split import SEQUENCE, for_stages, inputs_and_targets, is_cut, scored_tokens
from framework.config.types import PositiveInt
from framework.errors import ConfigError
from framework.sequences import IGNORE_INDEX
from framework.tasks.base import Task
from framework.tasks.metrics import Metrics
from framework.tasks.token_logps import output_logits, summed_nll, summed_nll_of, token_logps


def call_inputs_and_targets(batch) -> tuple[dict | tuple, torch.Tensor]:
    """As framework/batch_split.py's inputs_and_targets, with a (tokens, targets) batch's tokens as
    the model's one positional argument (how the model is called for such a batch: its own name for it)."""
    inputs, targets = inputs_and_targets(batch)
    return (inputs if isinstance(batch, Mapping) else (batch[0],)), targets


def logits_and_targets(model, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, targets) aligned position by position, flattened to (N, vocab) and (N,)."""
    if is_cut(batch):
        inputs, targets = inputs_and_targets(batch)
        logits = output_logits(model(**inputs))
    elif isinstance(batch, Mapping):
        if "input_ids" not in batch:
            raise ConfigError(f"task: a dict batch needs input_ids (it has {', '.join(batch)}).")
        labels = batch.get("labels", batch["input_ids"])
        logits = output_logits(model(**{k: v for k, v in batch.items() if k != "labels"}))
        logits, targets = logits[:, :-1], labels[:, 1:]
    else:
        tokens, targets = batch
        logits = output_logits(model(tokens))
    return logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1)


class LanguageModeling(Task):
    """Cross-entropy of the next token over the tokens not marked -100."""

    #: the batch kinds it reads (framework/data/batch_kinds.py)
    takes_batches = ("token_blocks", "tokens")

    throughput_unit = "tokens"
    #: its rows may be cut along the sequence too (context parallelism: framework/batch_split.py)
    batch_split = SEQUENCE

    def __init__(self, metrics: list | None = None, loss_chunk_tokens: PositiveInt | None = None):
        """metrics: torchmetrics metrics over the scored tokens besides loss and perplexity, e.g.
        [{metric: MulticlassAccuracy, top_k: 5, name: top5_accuracy}] (framework/tasks/metrics.py;
        num_classes: the vocabulary). loss_chunk_tokens: compute the output head and the loss this
        many tokens at a time, never the whole logits (framework/tasks/chunked_loss.py); null: the
        plain loss over the whole logits."""
        self.metrics = Metrics(metrics)
        if loss_chunk_tokens is not None and metrics:
            raise ConfigError("task.loss_chunk_tokens with task.metrics: the metrics are computed from the logits, "
                              "which the chunked loss never makes whole; set task.metrics=[] or "
                              "task.loss_chunk_tokens=null.")
        self.loss_chunk_tokens = loss_chunk_tokens

    def token_losses(self, model, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(each position's loss (N,), its target (N,)): the negative of its token log-probability
        (framework/tasks/token_logps.py), through the chunked head where task.loss_chunk_tokens is
        set, else from the whole logits."""
        inputs, targets = call_inputs_and_targets(batch)
        return -token_logps(model, inputs, targets, self.loss_chunk_tokens).reshape(-1), targets.reshape(-1)

    def training_step(self, model, batch) -> torch.Tensor:
        total, count = self.training_sums(model, batch)
        return total / count.clamp(min=1)

    def training_sums(self, model, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss summed over the batch's scored tokens, and their number (the loop divides by the
        step's scored tokens on every rank: framework/tasks/base.py)."""
        if self.loss_chunk_tokens is None:  # the whole logits' cross-entropy, summed in its own order
            logits, targets = logits_and_targets(model, batch)
            return summed_nll_of(logits, targets), (targets != IGNORE_INDEX).sum()
        inputs, targets = call_inputs_and_targets(batch)
        return summed_nll(model, inputs, targets, self.loss_chunk_tokens), (targets != IGNORE_INDEX).sum()

    def scored_count(self, batch) -> int:
        """Tokens the loss scores in `batch`: every next token whose label is not -100."""
        return scored_tokens(batch)

    def pipeline_split(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(token ids, each position's next-token label: -100 where none is scored), for stages."""
        return for_stages(batch)

    def summed_loss(self, outputs, targets) -> torch.Tensor:
        """The next-token loss of a pipeline's last stage, summed over its scored tokens."""
        logits = output_logits(outputs)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                               ignore_index=IGNORE_INDEX, reduction="sum")

    def validation_step(self, model, batch) -> dict[str, torch.Tensor]:
        if self.loss_chunk_tokens is not None or not self.metrics:
            total, count = self.training_sums(model, batch)
            return {"loss_sum": total.double(), "tokens": count.double()}
        logits, targets = logits_and_targets(model, batch)  # the metrics read the logits themselves
        loss_sum = F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")
        sums = {"loss_sum": loss_sum.double(), "tokens": (targets != IGNORE_INDEX).sum().double()}
        if self.metrics:
            scored = targets != IGNORE_INDEX
            sums.update(self.metrics.batch_sums(logits[scored] if not logits.is_meta else logits, targets[scored]
                                                if not targets.is_meta else targets))
        return sums

    def predict_step(self, model, batch) -> dict[str, torch.Tensor]:
        """Each sequence's mean next-token loss over its scored tokens, its perplexity, and the
        number of tokens scored."""
        tokens = batch["input_ids"] if isinstance(batch, Mapping) else batch[0]
        losses, targets = self.token_losses(model, batch)
        losses = losses.view(tokens.shape[0], -1)
        counts = (targets != IGNORE_INDEX).view(tokens.shape[0], -1).sum(dim=1)
        loss = losses.sum(dim=1) / counts.clamp(min=1)
        return {"loss": loss, "perplexity": loss.clamp(max=50.0).exp(), "tokens": counts}

    def compute_metrics(self, sums) -> dict[str, float]:
        loss = (sums["loss_sum"] / sums["tokens"].clamp(min=1)).item()
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), **self.metrics.compute(sums)}

    def batch_size(self, batch) -> int:
        """Tokens in the batch (padding included: counting the mask would cost a device sync)."""
        tokens = batch["input_ids"] if isinstance(batch, Mapping) else batch[0]
        return int(tokens.numel())
