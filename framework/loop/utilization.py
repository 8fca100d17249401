"""Model-FLOPs utilisation (`train/mfu`): the FLOPs the model's training needs per item
(framework/models/flops.py) times the items trained per second, over the peak of every device of
the run (framework/accelerator/peak_flops.py, or trainer.peak_tflops)."""
from __future__ import annotations

import torch

from framework.accelerator.peak_flops import arithmetic, device_name, peak_flops
from framework.models.flops import training_flops_per_item


class Utilization:
    """Knows the run's peak FLOP/s; learns the sequence length from the first training batch."""

    def __init__(self, model: torch.nn.Module, device: torch.device, compute_dtype: torch.dtype, devices: int,
                 peak_tflops: float | None, manual: bool):
        self.model, self.devices = model, devices
        self.peak = peak_tflops * 1e12 if peak_tflops else peak_flops(device, compute_dtype)
        self.why_not = ""
        if manual:
            self.why_not = "a task that steps its optimizers itself has no FLOPs count per item"
        elif self.peak is None:
            self.why_not = (f"the peak dense TFLOP/s of {device_name(device)} in {arithmetic(compute_dtype)} "
                            "arithmetic is not in framework/accelerator/peak_flops.py; set trainer.peak_tflops to "
                            "log it")
        self.waiting = not self.why_not  # for the first batch's shape
        self.flops_per_item: float | None = None

    def see(self, batch) -> None:
        """The first training batch: its sequence length (a token batch) sets the attention term."""
        self.waiting = False
        ids = batch.get("input_ids") if isinstance(batch, dict) else batch
        if isinstance(ids, (tuple, list)):
            ids = ids[0]
        context = ids.shape[1] if isinstance(ids, torch.Tensor) and ids.dim() == 2 and not ids.is_floating_point() \
            else None
        self.flops_per_item = training_flops_per_item(self.model, context)
        if self.flops_per_item is None:
            self.why_not = f"{type(self.model).__name__} has layers the FLOPs count does not price"

    def of(self, items_per_s: float) -> float | None:
        """The fraction of the devices' peak the throughput `items_per_s` (over all ranks) is."""
        if self.flops_per_item is None or self.peak is None:
            return None
        return items_per_s * self.flops_per_item / (self.peak * self.devices)
