"""Test tasks (test code: runs allow `tests.helpers.` in the trust list)."""
from __future__ import annotations

from framework.tasks.language_modeling import LanguageModeling, logits_and_targets, output_logits


class LanguageModelingWithAccuracy(LanguageModeling):
    """Returns a dict: the loss plus the next-token accuracy, which the loop logs as train/accuracy."""

    def training_step(self, model, batch):
        logits, targets = logits_and_targets(model, batch)
        loss = super().training_step(model, batch)
        keep = targets != -100
        return {"loss": loss, "accuracy": (logits.argmax(-1)[keep] == targets[keep]).float().mean()}

    def summed_loss(self, outputs, targets):
        """Under pipeline stages: the summed loss plus the same accuracy, from the last stage."""
        logits = output_logits(outputs)
        keep = targets != -100
        return {"loss": super().summed_loss(outputs, targets),
                "accuracy": (logits.argmax(-1)[keep] == targets[keep]).float().mean()}
