"""One loop micro-batch's forward and backward (Strategy.forward_backward): what loss is
backpropagated, with which weight, and what is logged beside it."""
from __future__ import annotations

from typing import Any, Callable

import torch


def forward_backward(strategy, model: torch.nn.Module, task, batch, group: int, scale: float | None,
                     loss_of: Callable[[Any], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward of one loop micro-batch (on the device) of a step of `group`. With
    `scale` (a task whose loss is normalised by the step's scored items: framework/tasks/base.py)
    its summed loss times scale is backpropagated, else its loss (`loss_of` reads it from what
    training_step returned) over the group; the model's own losses (a mixture of experts'
    balancing: `task.model_losses`) are added to it, weighted alike, and logged apart. Returns
    (the loss the non-finite guard watches, the micro-batch's share of the step's mean loss, for
    logging). A pipeline runs both passes of every stage in its schedule instead
    (framework/strategy/mesh/pipeline/run.py)."""
    with strategy.forward_context():
        if scale is None:
            loss = logged = loss_of(task.training_step(model, batch))
        else:
            sums = task.training_sums(model, batch)
            loss = sums[0] * scale
            logged = loss * group  # a micro-batch's share, as a mean over the step (logging)
            if len(sums) > 2 and sums[2]:  # (sum, count, values to log beside the loss)
                loss_of({"loss": logged, **sums[2]})
        extra, values = task.model_losses(model, summed=scale is not None)
    if values:
        loss_of({"loss": logged, **values})  # logged beside the loss, as a training_step's dict is
    total = loss if extra is None else loss + (extra if scale is None else extra * scale)
    strategy.backward(total / group if scale is None and group > 1 else total)  # x / 1: an op for nothing
    return loss, logged
