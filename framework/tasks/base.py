"""The Task base class a user subclasses for custom training and validation steps."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable

import torch

from framework.batch_split import WHOLE_ROWS, BatchSplit
from framework.models import moe_stats
from framework.models.stage_routing import StageRouting
from framework.tasks.second_model import Frozen, FrozenSource


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
    #: the kinds of batch it reads (framework/data/batch_kinds.py's KINDS); a data module giving another
    #: is refused before launch naming the data options that fit. None: any (its step on an example
    #: batch decides)
    takes_batches: tuple[str, ...] | None = None

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

    #: optional, for losses over a varying number of items (masked tokens): `training_sums(model,
    #: batch) -> (the loss summed over the micro-batch's scored items, their number)` with
    #: `scored_count(batch) -> int` (read from the batch alone, before any forward). The loop then
    #: divides each step's summed loss by the items scored in the whole step, on every rank and in
    #: every micro-batch (one all-reduce of a count per step), so that a step's gradient does not
    #: depend on how its batch is split into ranks and micro-batches (transformers' global token
    #: count). A subclass that writes its own training_step keeps it (framework/tasks/base.py
    #: sums_normalised).
    training_sums: Callable | None = None
    scored_count: Callable | None = None

    #: how its batch may be cut besides whole rows over the data-parallel ranks (framework/batch_split.py):
    #: WHOLE_ROWS (the default) or SEQUENCE (rows cut along the sequence over context-parallel ranks,
    #: its next-token labels shifted before the cut). A task whose rows come in groups keeps each group
    #: one sample of its data set (a preference pair: framework/tasks/preference.py), so that no cut
    #: separates them.
    batch_split: BatchSplit = WHOLE_ROWS

    #: optional, for online learning (framework/tasks/grpo.py): `rollout(model, batches, step, ranks) ->
    #: batches`, the step's micro-batches (this rank's, on the device) made into what it trains on from
    #: the model itself (completions sampled and scored), called by the loop once a step before any
    #: forward (`ranks`: framework/tasks/rollout.py Ranks); with `num_iterations` k the loop trains the
    #: rolled batches for k optimizer steps. Such a task also gives `rolled_example(batch)`: a rolled
    #: batch of the shapes a data batch gives, which the checks before launch run through the model.
    rollout: Callable | None = None
    num_iterations: int = 1

    #: optional, for pipeline stages (strategy=pipeline, or model_parallel with
    #: pipeline_parallel_size > 1: framework/strategy/mesh/pipeline/run.py), which run the model
    #: piece by piece: `pipeline_split(batch) -> (the first stage's input, the targets)`, both cut
    #: along their first dimension into microbatches, and `summed_loss(outputs, targets)` -> the
    #: loss of the last stage's outputs summed over the items it scores (the pipeline weights it as
    #: the loop would: by the step's scale for a task with training_sums, else as a mean over the
    #: micro-batch's samples), or a dict holding that `loss` and other values to log as
    #: train/<key> (each a mean over the microbatches, as training_step's dict is logged). A task
    #: without them is refused before launch under a pipelined strategy.
    pipeline_split: Callable | None = None
    summed_loss: Callable | None = None

    #: `predict_step(model, batch) -> {name: tensor of shape (B, ...)}`, the per-sample predictions
    #: `framework predict` writes; a task that leaves it None is refused there before launch
    predict_step: Callable[[torch.nn.Module, object], dict[str, torch.Tensor]] | None = None

    @property
    def can_predict(self) -> bool:
        return self.predict_step is not None

    @abstractmethod
    def compute_metrics(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        """Metrics from the totals of every validation (or test) batch on every rank."""

    def model_losses(self, model: torch.nn.Module, summed: bool) -> tuple[torch.Tensor | None, dict]:
        """The model's own losses from the forward just run, added to the task's (a mixture of
        experts' balancing and z-losses: framework/models/moe_stats.py): summed over the micro-batch's
        tokens (`summed=True`: weighted as training_sums' sum is) or as a mean, None where the
        model adds none; and the values to log beside the loss (train/<key>)."""
        if not moe_stats.routed_modules(model):  # a dense model: asked every micro-batch, answered at once
            return None, {}
        return moe_stats.router_losses(model, summed), moe_stats.router_values(model)

    def stage_routing(self, stages: dict[int, torch.nn.Module]) -> StageRouting:
        """Under pipeline stages (`stages`: those this rank holds), what replaces model_losses' values:
        a watch over the stages' routing records whose `values(...)` the pipeline logs each step
        (framework/models/stage_routing.py)."""
        return StageRouting(stages)

    #: whether the trainer turns the model's dropout off (every torch.nn.Dropout's p set to 0, as trl's
    #: disable_dropout does): a preference task's log-probability ratios are meant without it
    disable_dropout: bool = False

    #: whether the task may compute with a frozen second model (frozen_source says which, per instance):
    #: the compatibility table refuses layouts that cannot place one
    frozen_model: bool = False

    def frozen_source(self) -> FrozenSource | None:
        """Where a frozen model the task computes with beside the trained one comes from (a
        preference task's reference, a distillation's teacher); None (this default): the task needs
        none. The protocol: framework/tasks/second_model.py."""
        return None

    #: the second model frozen_source asked for, once the framework handed it over (use_frozen)
    frozen: Frozen | None = None

    def use_frozen(self, frozen: Frozen) -> None:
        """The second model, handed over once before the first step: compute with it through
        `self.frozen.computing(model)` (the placed model, or the trained one with its adapters off)."""
        self.frozen = frozen

    def after_optimizer_step(self, model: torch.nn.Module, stepped: bool) -> None:
        """After each step's optimizer step (`stepped`: False where the step was left out): a mixture
        of experts' bias balancing moves by the step's counts (framework/models/moe_stats.py)."""
        moe_stats.update_expert_biases(model, stepped)

    def problems_with(self, data, model: torch.nn.Module) -> list[str]:
        """Before launch: what keeps this task from training `model` (on the meta device) on `data`,
        one message each naming the keys (a reward reading a field the rows lack; completions with
        no room in the model's context); none by default."""
        return []

    def batch_size(self, batch) -> int:
        first = batch[0] if isinstance(batch, (list, tuple)) else next(iter(batch.values()))
        return int(first.shape[0])


def sums_normalised(task) -> bool:
    """Whether the loop normalises `task`'s training loss by the scored items of each step: it has
    training_sums and scored_count, and the training_step written beside them is its own (a
    subclass with a training_step of its own trains with that)."""
    if getattr(task, "training_sums", None) is None or getattr(task, "scored_count", None) is None:
        return False
    mro = type(task).__mro__
    owner = next((i for i, cls in enumerate(mro) if "training_sums" in cls.__dict__), None)
    return owner is not None and not any("training_step" in cls.__dict__ for cls in mro[:owner])


def without_dropout(model: torch.nn.Module) -> int:
    """Every torch.nn.Dropout of `model` set to p=0 (trl's disable_dropout_in_model: a LoRA layer's
    dropout too); the number of them."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    for layer in layers:
        layer.p = 0.0
    return len(layers)
