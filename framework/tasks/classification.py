"""Classification: cross-entropy, reported as loss and accuracy."""
from __future__ import annotations

import torch
from torch.nn import functional as F

from framework.config.types import NonNegativeFloat
from framework.tasks.base import Task
from framework.tasks.metrics import Metrics


class Classification(Task):
    """Batches are (inputs, integer labels); the model returns logits of shape (B, classes)."""

    #: the batch kinds it reads (framework/data/batch_kinds.py)
    takes_batches = ("features",)

    def __init__(self, label_smoothing: NonNegativeFloat = 0.0, metrics: list | None = None):
        """label_smoothing: the cross-entropy label smoothing for training (0: none); metrics:
        torchmetrics metrics to report besides loss and accuracy, e.g. [MulticlassF1Score]
        (framework/tasks/metrics.py; num_classes from the model's output)."""
        self.label_smoothing = label_smoothing
        self.metrics = Metrics(metrics)

    def training_step(self, model, batch) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x).float(), y, label_smoothing=self.label_smoothing)

    def pipeline_split(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, labels): the first pipeline stage's input and the last stage's targets."""
        return batch[0], batch[1]

    def summed_loss(self, outputs, labels) -> torch.Tensor:
        """The training loss of a pipeline's last stage, summed over its samples."""
        return F.cross_entropy(outputs.float(), labels, label_smoothing=self.label_smoothing, reduction="sum")

    def validation_step(self, model, batch) -> dict[str, torch.Tensor]:
        x, y = batch
        logits = model(x).float()
        return {
            "loss_sum": F.cross_entropy(logits, y, reduction="sum").double(),
            "correct": (logits.argmax(dim=-1) == y).sum().double(),
            "count": torch.tensor(float(y.numel()), dtype=torch.float64, device=y.device),
            **self.metrics.batch_sums(logits, y),
        }

    def predict_step(self, model, batch) -> dict[str, torch.Tensor]:
        """The likeliest class, every class's probability, and the true label."""
        x, y = batch
        probabilities = model(x).float().softmax(dim=-1)
        return {"prediction": probabilities.argmax(dim=-1), "probabilities": probabilities, "label": y}

    def compute_metrics(self, sums) -> dict[str, float]:
        return {"loss": (sums["loss_sum"] / sums["count"]).item(),
                "accuracy": (sums["correct"] / sums["count"]).item(), **self.metrics.compute(sums)}
