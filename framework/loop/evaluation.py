"""The one loop over evaluation batches (validation, test; every pass that scores a data set):
each rank scores its share of the same samples, and the sums are added across ranks exactly, so a
metric does not depend on how many processes computed it."""
from __future__ import annotations

from typing import Callable

import torch

from framework.data.loaders import release_workers
from framework.data.splits import SPLIT_NAMES
from framework.errors import ConfigError

# The task method that scores a batch for each metric prefix.
STEPS = {"val": "validation_step", "test": "test_step"}

Step = Callable[[torch.nn.Module, object], dict]


def _scored_outputs(strategy, model: torch.nn.Module, loader, step: Step):
    """The step's output for each of this rank's batches, in order, the model in eval mode and
    without gradients. Collective: ranks agree on the number of forward passes first, and a rank
    whose share ran out runs the loader's filler batch (unscored, not yielded) until then."""
    passes = len(loader)
    if strategy.world_size > 1:  # agreed before any forward: the collectives of every pass must line up
        passes = int(strategy.reduce(torch.tensor(float(passes), device=strategy.root_device), "max").item())
    filler = getattr(loader, "filler", None)
    model.eval()
    try:
        with torch.no_grad():
            batches = iter(loader)
            for _ in range(passes):
                batch = next(batches, None)
                if batch is None and filler is None:
                    break  # an empty share and nothing to run: only possible with an empty set
                moved = strategy.batch_to_device(filler if batch is None else batch)
                with strategy.forward_context():
                    out = step(model, strategy.split_batch(moved))
                if batch is not None:  # the filler keeps this rank in step; its outputs are not scored
                    yield out
    finally:
        release_workers(loader)
        model.train()


def predict(strategy, model: torch.nn.Module, loader, step: Step):
    """Collective: (sample index in the data set, {name: value}) for each of this rank's samples,
    in order; values are plain Python (numbers, lists). Every sample goes to exactly one rank
    (framework/data/sampler.py), so the ranks' rows together are the data set, once each."""
    indices = iter(loader.sampler)
    for out in _scored_outputs(strategy, model, loader, step):
        columns = {name: torch.as_tensor(value).detach().cpu() for name, value in out.items()}
        count = len(next(iter(columns.values()))) if columns else 0
        for row in range(count):
            yield next(indices), {name: column[row].tolist() for name, column in columns.items()}


def evaluate(strategy, model: torch.nn.Module, loader, step: Step) -> dict[str, torch.Tensor]:
    """Run `step(model, batch) -> {name: sum}` over this rank's share (framework/data/loaders.py
    gives each sample to exactly one rank) and return every name's total over all ranks, float64 on
    the CPU, with the shape the step gave it (a scalar, or per-class counts).

    Collective: ranks whose share ran out run the model on the loader's filler batch, unscored, until
    every rank has made the same number of forward passes (a sharded model gathers its weights
    collectively in each)."""
    sums: dict[str, torch.Tensor] = {}
    for out in _scored_outputs(strategy, model, loader, step):
        for key, value in out.items():
            value = torch.as_tensor(value).detach().to(strategy.root_device, torch.float64)
            sums[key] = sums[key] + value if key in sums else value
    shapes = {key: tuple(value.shape) for key, value in sorted(sums.items())}
    if strategy.world_size > 1:  # rank zero holds the most samples, so it has every name
        shapes = strategy.broadcast(shapes)
    if not shapes:
        return {}
    flat = torch.cat([(sums[key] if key in sums else torch.zeros(shape, dtype=torch.float64,
                                                                   device=strategy.root_device)).reshape(-1)
                      for key, shape in shapes.items()])
    if not strategy.data_parallel.reports:  # a tensor-parallel rank: its group's first rank counts the same samples
        flat = torch.zeros_like(flat)
    flat = strategy.reduce(flat, "sum").cpu()  # one collective for every sum
    totals, start = {}, 0
    for key, shape in shapes.items():
        size = int(torch.Size(shape).numel())
        totals[key] = flat[start:start + size].reshape(shape)
        start += size
    return totals


def score(strategy, task, model: torch.nn.Module, loader, prefix: str) -> dict[str, float]:
    """Collective: the task's metrics over the whole loader at `prefix` ("val" or "test"), named
    `<prefix>/<metric>`, the same on every rank."""
    totals = evaluate(strategy, model, loader, getattr(task, STEPS[prefix]))
    if not totals:
        raise ConfigError(f"data: the {SPLIT_NAMES[prefix]} set gives no batches; give data a {SPLIT_NAMES[prefix]} "
                          "split with samples.")
    return {f"{prefix}/{name}": value for name, value in task.compute_metrics(totals).items()}
