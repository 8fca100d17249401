"""A classification task whose training step returns a tensor-valued statistic (per-class
prediction counts) and whose validation sums are per-class tensors (a hand-written macro recall)."""
from __future__ import annotations

import torch
from torch.nn import functional as F

from framework.tasks.classification import Classification


class ClassificationWithCounts(Classification):
    def training_step(self, model, batch):
        x, y = batch
        logits = model(x).float()
        return {"loss": F.cross_entropy(logits, y), "predicted": torch.bincount(logits.argmax(-1), minlength=10).double()}

    def validation_step(self, model, batch):
        x, y = batch
        hits = model(x).argmax(-1) == y
        return {"hits": torch.bincount(y[hits], minlength=10).double(), "per_class": torch.bincount(y, minlength=10).double()}

    def compute_metrics(self, sums):
        return {"macro_recall": (sums["hits"] / sums["per_class"].clamp(min=1)).mean().item()}
