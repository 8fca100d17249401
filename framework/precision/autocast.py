"""Mixed precision shared by `16` and `bf16`: float32 weights, autocast compute, optional scaling."""
from __future__ import annotations

import torch

from framework.precision.base import Precision


class AutocastPrecision(Precision):
    """Weights stay float32; matmuls run in `compute_dtype` under torch.autocast. With
    `loss_scaling`, a GradScaler multiplies the loss so small fp16 gradients do not underflow and
    skips any step whose gradients overflowed (then halves the scale)."""

    def __init__(self, compute_dtype: torch.dtype, loss_scaling: bool, init_scale: float = 2.0**16,
                 growth_interval: int = 2000):
        super().__init__()
        self.compute_dtype = compute_dtype
        self.loss_scaling = loss_scaling
        self.init_scale = init_scale
        self.growth_interval = growth_interval
        self.scaler: torch.amp.GradScaler | None = None

    def setup(self, device_type: str) -> None:
        super().setup(device_type)
        if self.loss_scaling:
            self.scaler = torch.amp.GradScaler(
                device_type, init_scale=self.init_scale, growth_interval=self.growth_interval
            )

    def sharded_param_dtypes(self):
        return self.compute_dtype, torch.float32

    def forward_context(self):
        return torch.autocast(self.device_type, dtype=self.compute_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def unscale_gradients(self, optimizer) -> None:
        if self.scaler:
            self.scaler.unscale_(optimizer)

    def optimizer_step(self, optimizer) -> bool:
        if self.scaler is None:
            optimizer.step()
            return True
        scale_before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        return self.scaler.get_scale() >= scale_before  # the scale drops only after a skipped step

    @property
    def loss_scale(self) -> float | None:
        return self.scaler.get_scale() if self.scaler else None

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict()} if self.scaler else {}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
