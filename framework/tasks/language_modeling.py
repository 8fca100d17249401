"""Next-token prediction: cross-entropy, reported as loss and perplexity."""
from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from framework.tasks.base import Task


class LanguageModeling(Task):
    """Batches are (tokens, next tokens); the model returns logits of shape (B, T, vocab)."""

    throughput_unit = "tokens"

    def training_step(self, model, batch) -> torch.Tensor:
        x, y = batch
        logits = model(x)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    def validation_step(self, model, batch) -> dict[str, torch.Tensor]:
        x, y = batch
        logits = model(x)
        loss_sum = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum")
        return {"loss_sum": loss_sum.double(), "tokens": torch.tensor(float(y.numel()), dtype=torch.float64)}

    def compute_metrics(self, sums) -> dict[str, float]:
        loss = (sums["loss_sum"] / sums["tokens"]).item()
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}

    def batch_size(self, batch) -> int:
        return int(batch[0].numel())
