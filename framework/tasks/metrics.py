"""torchmetrics metrics named in YAML, exact at any world size.

A task's `metrics` setting is a list; each entry is a torchmetrics class name, or a mapping of
`metric` (the class name), an optional `name` (what it is logged as) and the class's arguments:

    task.metrics: [MulticlassF1Score, {metric: MulticlassAccuracy, top_k: 3, name: top3}]

`num_classes` is taken from the model's output when not given; the metric is logged as
val/<name> (test/<name> when testing), by default the class name in snake case without its
Multiclass/Binary/Multilabel prefix (MulticlassF1Score: val/f1_score); a metric that returns one
value per class (average: none) logs val/<name>/<class>.

Exactness: every state of an accepted metric is a sum (torchmetrics' dist_reduce_fx "sum":
counts, a confusion matrix, a binned curve). Each batch's state is computed on its own and
returned with the validation step's sums, which the loop adds over batches and ranks in float64
(framework/loop/evaluation.py); compute() runs once, on the totals. So a metric is the same at
devices=1, 2 or 4, whatever the strategy. A metric that keeps the predictions themselves (AUROC
without thresholds: a "cat" state) is refused with the fix.
"""
from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Mapping

import torch

from framework.errors import ConfigError, did_you_mean

PACKAGES = ("torchmetrics.classification", "torchmetrics.regression", "torchmetrics.text", "torchmetrics")
PREFIX = "metric:"  # marks a torchmetrics state among a validation step's sums
PREFIXES = ("Multiclass", "Multilabel", "Binary")
# num_classes only for the check at construction (top_k and the like must fit); the real one is the model's output's
INFERRED_NUM_CLASSES = 256


def _torchmetrics():
    try:
        return importlib.import_module("torchmetrics")
    except ImportError as err:
        raise ConfigError("task.metrics needs torchmetrics: pip install 'framework[metrics]' (or torchmetrics)."
                          ) from err


def _find_class(name: str, key: str):
    _torchmetrics()
    for package in PACKAGES:
        found = getattr(importlib.import_module(package), name, None)
        if isinstance(found, type):
            return found
    known = sorted({n for p in PACKAGES for n in dir(importlib.import_module(p)) if n[:1].isupper()})
    raise ConfigError(f"{key}={name!r}: torchmetrics has no such metric.{did_you_mean(name, known)} Give a class of "
                      "torchmetrics.classification, torchmetrics.regression or torchmetrics (e.g. MulticlassF1Score).")


def default_name(class_name: str) -> str:
    """MulticlassF1Score -> f1_score; MeanSquaredError -> mean_squared_error."""
    for prefix in PREFIXES:
        if class_name.startswith(prefix) and len(class_name) > len(prefix):
            class_name = class_name[len(prefix):]
            break
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", class_name).lower()


def _takes(cls, argument: str) -> bool:
    return argument in inspect.signature(cls.__init__).parameters


class Metrics:
    """The metrics of one task: states per batch as sums, values from the totals."""

    def __init__(self, spec: list | None, key: str = "task.metrics"):
        self.entries: dict[str, tuple[type, dict]] = {}
        self._built: dict[str, object] = {}
        for i, entry in enumerate(list(spec or [])):
            where = f"{key}[{i}]"
            if isinstance(entry, str):
                class_name, kwargs, name = entry, {}, None
            elif isinstance(entry, Mapping) and "metric" in entry:
                kwargs = {str(k): v for k, v in dict(entry).items() if k not in ("metric", "name")}
                class_name, name = str(entry["metric"]), entry.get("name")
            else:
                raise ConfigError(f"{where}={entry!r}: give a torchmetrics class name, or a mapping with `metric` (the "
                                  "class name), an optional `name` and the class's arguments.")
            cls = _find_class(class_name, where)
            name = str(name or default_name(class_name))
            if name in self.entries:
                raise ConfigError(f"{where}: a second metric named {name!r}; give one of them another `name`.")
            self.entries[name] = (cls, kwargs)
            self._check_states(name, cls, kwargs, where)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def _make(self, cls, kwargs: dict, num_classes: int | None):
        if num_classes is not None and "num_classes" not in kwargs and _takes(cls, "num_classes"):
            kwargs = {**kwargs, "num_classes": num_classes}
        return cls(**kwargs)

    def _check_states(self, name: str, cls, kwargs: dict, where: str) -> None:
        """Built once here, so a wrong argument or a state that is not a sum is refused before launch."""
        from torchmetrics.utilities.data import dim_zero_sum

        try:
            metric = self._make(cls, kwargs, INFERRED_NUM_CLASSES)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{where} ({cls.__name__}): {str(err).splitlines()[0]}") from err
        not_sums = [state for state, reduce in metric._reductions.items() if reduce is not dim_zero_sum]
        if not_sums:
            raise ConfigError(f"{where} ({cls.__name__}): its state {', '.join(not_sums)} keeps every prediction, "
                              "which cannot be added exactly across batches and ranks; choose a form with fixed-size "
                              "sums (for curves and AUROC: thresholds=100).")

    def metric(self, name: str, preds: torch.Tensor):
        """The metric object, built at the first batch (num_classes from the output's last dimension)."""
        if name not in self._built:
            cls, kwargs = self.entries[name]
            num_classes = int(preds.shape[-1]) if preds.dim() > 1 and preds.is_floating_point() else None
            self._built[name] = self._make(cls, kwargs, num_classes)
        metric = self._built[name]
        if preds.device.type != "meta" and metric.device != preds.device:
            metric.to(preds.device)
        return metric

    def batch_sums(self, preds: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each metric's state for this batch alone, as sums named metric:<name>/<state>."""
        sums = {}
        for name in self.entries:
            metric = self.metric(name, preds)
            if preds.device.type == "meta":  # the check before launch: shapes only
                states = {state: torch.zeros_like(default, device="meta")
                          for state, default in metric._defaults.items()}
            else:
                metric.reset()
                metric.update(preds.detach(), target)
                states = {state: getattr(metric, state) for state in metric._defaults}
            sums.update({f"{PREFIX}{name}/{state}": value.double() for state, value in states.items()})
        return sums

    def compute(self, totals: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """Every metric from its summed states: {name: value}, or {name/<i>: value} per class."""
        values = {}
        for name in self.entries:
            found = {k.split("/", 1)[1]: v for k, v in totals.items() if k.startswith(f"{PREFIX}{name}/")}
            if not found:
                continue
            metric = self._built.get(name)
            if metric is None:  # no batch reached this process: nothing to compute from
                continue
            for state, default in metric._defaults.items():
                total = found[state] if default.is_meta else found[state].to(default.device)  # meta: the check
                setattr(metric, state, total.round().to(default.dtype) if not default.is_floating_point()
                        else total.to(default.dtype))
            metric._update_count, metric._computed = 1, None
            value = metric.compute()
            if isinstance(value, torch.Tensor) and value.numel() > 1:
                values.update({f"{name}/{i}": float(v) for i, v in enumerate(value.reshape(-1).tolist())})
            else:
                values[name] = float(value)
        return values

