"""The Task base class a user subclasses for custom training and validation steps."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable

import torch


class Task(ABC):
    """Turns a batch into a loss (training) and into summable statistics (validation).

    - `training_step(model, batch)` returns the loss to minimise (a scalar tensor).
    - `validation_step(model, batch)` returns a dict of tensors that are *sums* over the batch
      (e.g. summed loss and a count). Sums add up across batches and ranks exactly, so the loop
      reduces them with one all-reduce and then calls
    - `compute_metrics(sums)`, which turns the totals into the reported metrics (loss,
      perplexity, accuracy...). Metric names get a `val/` prefix when logged.
    - `test_step(model, batch)` scores the test split the same way (`framework test`,
      `trainer.test_at_end`); by default it is the validation step, and its metrics, from the
      same `compute_metrics`, get a `test/` prefix.
    - `predict_step(model, batch)` (`framework predict`) returns what the task predicts for each
      sample of the batch: a dict of tensors whose first dimension is the batch (a class and its
      probabilities; a sequence's loss). One row per sample is written, in the data's order.
    - `batch_size(batch)` counts samples for throughput.

    Manual optimization (several optimizers, e.g. a GAN): set `automatic_optimization = False`,
    return named parameter groups from `optimizer_groups(model)` (one optimizer each, built from
    the `optimizer` config), and take a third argument, `training_step(model, batch,
    optimization)`: call `optimization.backward(loss)` and `optimization.step(name)` yourself
    (framework/tasks/manual.py), and return a dict of scalar tensors to log (`train/<key>`).
    """

    #: the unit `batch_size` counts, shown in throughput ("samples/s", "tokens/s")
    throughput_unit = "samples"
    #: False: the task steps its optimizers itself (see the class docstring)
    automatic_optimization: bool = True

    def optimizer_groups(self, model: torch.nn.Module) -> dict:
        """Manual optimization: {name: parameters}, one optimizer per entry, covering every
        trainable parameter once."""
        return {"default": model.parameters()}

    @abstractmethod
    def training_step(self, model: torch.nn.Module, batch) -> torch.Tensor:
        """The loss of one micro-batch."""

    @abstractmethod
    def validation_step(self, model: torch.nn.Module, batch) -> dict[str, torch.Tensor]:
        """Per-batch sums to accumulate (float tensors)."""

    def test_step(self, model: torch.nn.Module, batch) -> dict[str, torch.Tensor]:
        """Per-batch sums on the test split; by default the validation step's."""
        return self.validation_step(model, batch)

    #: `predict_step(model, batch) -> {name: tensor of shape (B, ...)}`, the per-sample predictions
    #: `framework predict` writes; a task that leaves it None is refused there before launch
    predict_step: Callable[[torch.nn.Module, object], dict[str, torch.Tensor]] | None = None

    @property
    def can_predict(self) -> bool:
        return self.predict_step is not None

    @abstractmethod
    def compute_metrics(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        """Metrics from the totals of every validation (or test) batch on every rank."""

    def batch_size(self, batch) -> int:
        first = batch[0] if isinstance(batch, (list, tuple)) else next(iter(batch.values()))
        return int(first.shape[0])
