"""`precision=te_fp8`: fp8 matmuls through NVIDIA TransformerEngine (GPUs of compute capability
8.9 and later: L4, L40, RTX 40xx, H100, H200, B200). Refused before launch anywhere else, with the
reason (framework/config/compatibility.py).

The model's `torch.nn.Linear` layers whose dimensions fp8 GEMMs accept (both divisible by 16) and
its `torch.nn.LayerNorm` layers become TransformerEngine's, with their weights copied; they compute
in fp8 inside `te.fp8_autocast` with a delayed-scaling recipe (per-tensor scales from a history of
absolute maxima, kept in the layers' `_extra_state`, so a checkpoint resumes them). Weights stay
in `weights_dtype` (float32 by default: fp32 master weights, as in mixed precision), and what fp8
does not cover runs under bf16 autocast. The parameter names are unchanged, so checkpoints move to
and from the other precisions (the fp8 scaling state is dropped for a model without it).

TransformerEngine is imported only when this precision converts a model.
"""
from __future__ import annotations

from contextlib import ExitStack

import torch

from framework.errors import ConfigError
from framework.precision.base import Precision

WEIGHT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
FORMATS = ("HYBRID", "E4M3")


def _fp8_linear(module: torch.nn.Module) -> bool:
    return type(module) is torch.nn.Linear and module.in_features % 16 == 0 and module.out_features % 16 == 0


def _layer_norm(module: torch.nn.Module) -> bool:
    return type(module) is torch.nn.LayerNorm and len(module.normalized_shape) == 1 and module.elementwise_affine


class TransformerEngineFP8Precision(Precision):
    """fp8 linear layers and fused LayerNorms through TransformerEngine, on fp8-capable GPUs."""

    name = "te_fp8"
    #: TransformerEngine's modules run fused kernels of their own (its own fp8 autocast region)
    supports_compile = False
    compute_dtype = torch.bfloat16
    #: the Python package this precision needs (the compatibility table checks it is installed)
    python_package = "transformer_engine"
    install_hint = ("pip install --no-build-isolation 'transformer_engine[pytorch]' on a machine with CUDA "
                    "(NVIDIA's NGC PyTorch containers ship it)")

    def __init__(self, weights_dtype: str = "fp32", fp8_format: str = "HYBRID", amax_history_len: int = 1024,
                 amax_compute_algo: str = "max", margin: int = 0):
        """weights_dtype: the weights' dtype (fp32: master weights in float32; bf16); fp8_format:
        HYBRID (e4m3 forward, e5m2 gradients) or E4M3; amax_history_len, amax_compute_algo (max,
        most_recent), margin: TransformerEngine's DelayedScaling recipe."""
        super().__init__()
        if weights_dtype not in WEIGHT_DTYPES:
            raise ConfigError(f"precision.weights_dtype={weights_dtype!r}: use one of {', '.join(WEIGHT_DTYPES)}.")
        if fp8_format not in FORMATS:
            raise ConfigError(f"precision.fp8_format={fp8_format!r}: use one of {', '.join(FORMATS)}.")
        if amax_compute_algo not in ("max", "most_recent"):
            raise ConfigError(f"precision.amax_compute_algo={amax_compute_algo!r}: use max or most_recent.")
        self.weights_dtype_name = weights_dtype
        self.param_dtype = WEIGHT_DTYPES[weights_dtype]
        self.fp8_format = fp8_format
        self.amax_history_len = amax_history_len
        self.amax_compute_algo = amax_compute_algo
        self.margin = margin
        self.conversion_note = ""

    def plan_layers(self, model: torch.nn.Module) -> tuple[list[str], list[str]]:
        """(layers TransformerEngine takes over, linear layers kept with the reason)."""
        chosen, kept = [], []
        for name, module in model.named_modules():
            if _fp8_linear(module) or _layer_norm(module):
                chosen.append(name)
            elif type(module) is torch.nn.Linear:
                kept.append(f"{name} ({module.in_features}x{module.out_features}: fp8 needs multiples of 16)")
        return chosen, kept

    def model_problems(self, model: torch.nn.Module) -> list[str]:
        if not any(_fp8_linear(m) for m in model.modules()):
            return [f"precision={self.name}: the model has no torch.nn.Linear layer whose dimensions are multiples of "
                    "16, so nothing would compute in fp8; use precision=bf16."]
        return []

    def _recipe(self):
        from transformer_engine.common.recipe import DelayedScaling, Format

        return DelayedScaling(fp8_format=getattr(Format, self.fp8_format), amax_history_len=self.amax_history_len,
                              amax_compute_algo=self.amax_compute_algo, margin=self.margin)

    def convert_module(self, model: torch.nn.Module) -> torch.nn.Module:
        import transformer_engine.pytorch as te

        chosen, kept = self.plan_layers(model)
        modules = dict(model.named_modules())
        device = torch.device("cuda", torch.cuda.current_device())
        for name in chosen:
            source = modules[name]
            with torch.no_grad():
                if isinstance(source, torch.nn.Linear):
                    layer = te.Linear(source.in_features, source.out_features, bias=source.bias is not None,
                                      params_dtype=self.param_dtype, device=device)
                else:
                    layer = te.LayerNorm(source.normalized_shape[0], eps=source.eps, params_dtype=self.param_dtype,
                                         device=device)
                layer.weight.copy_(source.weight)
                if source.bias is not None:
                    layer.bias.copy_(source.bias)
            parent, _, child = name.rpartition(".")
            setattr(modules[parent] if parent else model, child, layer)
        model.to(self.param_dtype)
        self.conversion_note = (f"precision=te_fp8: {len(chosen)} layers computed by TransformerEngine (fp8 "
                                f"{self.fp8_format}, delayed scaling over {self.amax_history_len} steps)"
                                + (f"; kept in bf16: {', '.join(kept)}" if kept else ""))
        return model

    def forward_context(self):
        import transformer_engine.pytorch as te

        stack = ExitStack()
        stack.enter_context(torch.autocast(self.device_type, dtype=torch.bfloat16))  # what fp8 does not cover
        stack.enter_context(te.fp8_autocast(enabled=True, fp8_recipe=self._recipe()))
        return stack

    def sharded_param_dtypes(self):
        return None  # TransformerEngine casts inside its layers

    def __repr__(self) -> str:
        return f"{type(self).__name__}(weights_dtype={self.weights_dtype_name}, fp8_format={self.fp8_format})"
