"""The Precision base class: float32, plus the gradient clipping every precision shares."""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, ContextManager, Iterable

import torch

from framework.tensors import map_tensors


def cast_floating(data: Any, dtype: torch.dtype) -> Any:
    """`data` with every floating-point tensor cast to `dtype` (nested tuples, lists, dicts)."""
    return map_tensors(data, lambda t: t.to(dtype) if t.is_floating_point() else t)


class Precision:
    """Full float32 precision; subclasses change dtypes, autocast and loss scaling.

    Method surface, in the order the strategy calls it: before launch `model_problems(meta_model)`
    and `frozen_weights(meta_model)`; `setup(device_type)`, `convert_module`,
    per micro-batch `convert_input` and `forward_context`, `backward`; `prepare_optimizer` once the
    optimizer is built; per optimizer step `clip_gradients` (unscales first when scaling), `optimizer_step` (False when the step was
    skipped); `state_dict` / `load_state_dict` for checkpoints.
    """

    name = "32"
    #: dtype of the parameters the optimizer updates
    param_dtype: torch.dtype = torch.float32
    #: dtype autocast computes in, if any
    compute_dtype: torch.dtype = torch.float32
    #: what `convert_module` did to the model, said once at start (quantized precisions)
    conversion_note: str = ""
    #: chosen to save memory (quantized precisions): the accelerator then favours low memory over
    #: speed where it has a choice, as for sharding strategies (framework/accelerator/cpu.py)
    saves_memory: bool = False
    #: whether `trainer.compile` can compile a model converted by it (the compatibility table reads it)
    supports_compile: bool = True

    def __init__(self):
        self.device_type = "cpu"

    def setup(self, device_type: str) -> None:
        self.device_type = device_type

    def model_problems(self, model: torch.nn.Module) -> list[str]:
        """Problems with this precision's settings for this model (built on the meta device),
        checked before launch; one message per problem."""
        return []

    def frozen_weights(self, model: torch.nn.Module) -> tuple[int, int]:
        """(parameters `convert_module` freezes, their bytes afterwards), for `framework plan`."""
        return 0, 0

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module

    def convert_input(self, batch: Any) -> Any:
        return batch

    def forward_context(self) -> ContextManager:
        return nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients to their true scale before clipping (a no-op without loss scaling)."""

    def clip_gradients(
        self,
        parameters: Iterable[torch.Tensor],
        optimizer: torch.optim.Optimizer,
        max_norm: float | None = None,
        max_value: float | None = None,
    ) -> torch.Tensor | None:
        """Clip by value and/or by global norm; returns the total norm before clipping (or None)."""
        if max_norm is None and max_value is None:
            return None
        self.unscale_gradients(optimizer)
        params = [p for p in parameters if p.grad is not None]
        if max_value is not None:
            torch.nn.utils.clip_grad_value_(params, max_value)
        if max_norm is not None:
            return torch.nn.utils.clip_grad_norm_(params, max_norm)
        return None

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        optimizer.step()
        return True

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> str:
        """Adjust a freshly built optimizer to the dtype it updates (e.g. an `eps` the dtype cannot
        hold); returns what was changed, said once at start ('' for nothing)."""
        return ""

    def sharded_param_dtypes(self) -> tuple[torch.dtype, torch.dtype] | None:
        """(dtype parameters are gathered in for compute, dtype gradients are reduced in) for
        sharding strategies that cast parameters themselves (FSDP's MixedPrecisionPolicy,
        DeepSpeed's bf16/fp16 sections); None: no casting by the strategy."""
        return None

    @property
    def loss_scale(self) -> float | None:
        """The current loss scale of fp16 training (None without loss scaling)."""
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
