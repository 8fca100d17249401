"""The training metrics between two logs: the loss summed over the window's micro-batches (on the
device, read once per log), a task's other logged values, the batches and items counted, and the
clock the throughput is read from. A step's micro-batches are summed apart (`StepSums`) and
join the window only once the step is taken: a step the skip policy leaves out is left out of the
logged loss too."""
from __future__ import annotations

import time
from collections.abc import Mapping

import torch


class StepSums:
    """One optimizer step's micro-batches, until the step is taken. The loss is summed in float64:
    on the device as a tensor (read once per log), on the CPU as a Python float (a host read costs
    a microsecond there, the tensor operations it saves several: a tiny model's step notices)."""

    __slots__ = ("host", "total", "batches", "items")

    def __init__(self, device):
        self.host = torch.device(device).type == "cpu"
        self.total = 0.0 if self.host else torch.zeros((), dtype=torch.float64, device=device)
        self.batches = 0
        self.items = 0

    def add(self, loss: torch.Tensor, items: int) -> None:
        if self.host:
            self.total += loss.item()  # a float32's value is exact in a float64: the same sum as on a device
        else:
            self.total += loss.detach().double()
        self.batches += 1
        self.items += items

    @property
    def loss(self) -> torch.Tensor:
        """The step's summed loss as a float64 tensor (on the device; on the CPU a new one)."""
        return torch.tensor(self.total, dtype=torch.float64) if self.host else self.total

    def clear(self) -> None:
        if self.host:
            self.total = 0.0
        else:
            self.total.zero_()
        self.batches = self.items = 0


class MetricWindow:
    """What the next `train/` log reports: means per batch over the window (and the ranks)."""

    def __init__(self, device):
        self.device = device
        self.host = torch.device(device).type == "cpu"
        self.total = 0.0 if self.host else torch.zeros((), dtype=torch.float64, device=device)  # as StepSums'
        self.values: dict[str, torch.Tensor] = {}
        self.batches = 0
        self.items = 0
        self.start = time.perf_counter()

    def add_step(self, step: StepSums, groups_loss: torch.Tensor | None = None) -> None:
        """A taken step; with replica groups, `groups_loss` is its loss averaged over the groups that
        took part: train/loss, the same in every group's log; this group's own is train/group_loss."""
        if groups_loss is None:
            self.total += step.total
        else:
            self.total += groups_loss.item() if self.host else groups_loss
            own = self.values.get("group_loss")
            self.values["group_loss"] = step.loss.clone() if own is None else own + step.loss
        self.batches += step.batches
        self.items += step.items

    def add_batch(self, items: int) -> None:
        """A batch whose loss is among its values (a task that steps its optimizers itself)."""
        self.batches += 1
        self.items += items

    def add_values(self, values: Mapping) -> None:
        """A training_step's other outputs, summed per key (logged as means, like the loss)."""
        for key, value in values.items():
            value = torch.as_tensor(value).detach().double().to(self.device)
            self.values[key] = self.values[key] + value if key in self.values else value

    def take_off(self, seconds: float) -> None:
        """Time that was not training (validation, a save): off the throughput's clock."""
        self.start += seconds

    def sums(self, with_loss: bool) -> dict[str, torch.Tensor]:
        sums = dict(self.values)
        if with_loss and self.batches:  # none: every step of the window was skipped
            sums["loss"] = torch.tensor(self.total, dtype=torch.float64) if self.host else self.total
        return sums

    def means(self, sums: dict[str, torch.Tensor], reduce) -> dict[str, float]:
        """Each value's mean per batch over the window and the ranks (`reduce`: the strategy's mean
        all-reduce), one collective for all of them; a value with several elements (per-class
        counts) is logged as <key>/<i>."""
        keys = sorted(sums)
        if not keys:
            return {}
        batches = max(self.batches, 1)
        flat = reduce(torch.cat([sums[k].reshape(-1) for k in keys]) / batches).tolist()
        means, start = {}, 0
        for key in keys:
            size = sums[key].numel()
            if sums[key].dim() == 0:
                means[key] = flat[start]
            else:
                means.update({f"{key}/{i}": value for i, value in enumerate(flat[start:start + size])})
            start += size
        return means

    def reset(self) -> None:
        if self.host:
            self.total = 0.0
        else:
            self.total.zero_()
        self.values = {}
        self.batches = self.items = 0
        self.start = time.perf_counter()

    def state_dict(self) -> dict:
        loss = torch.tensor(self.total, dtype=torch.float64) if self.host else self.total.cpu()
        return {"loss": loss, "batches": self.batches, "items": self.items,
                "values": {k: v.cpu() for k, v in self.values.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.total = float(state["loss"]) if self.host else state["loss"].to(self.device, torch.float64)
        self.batches, self.items = state["batches"], state["items"]
        # values: a training_step's other outputs (older checkpoints lack them)
        self.values = {k: v.to(self.device) for k, v in state.get("values", {}).items()}
