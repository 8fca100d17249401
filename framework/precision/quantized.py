"""Quantized precisions shared by `bnb_int8`, `bnb_nf4`, `bnb_nf4_dq` and `bnb_fp4`: the model's
linear layers become bitsandbytes layers with frozen, quantized weights; everything else (biases,
embeddings, norms, skipped layers) stays float32 and trains. For fine-tuning the rest of a model
(or adapters a model adds) in a fraction of the memory.

The strategy builds the model on the meta device and quantizes each chosen layer as soon as its
weights are made (framework/construction/quantized_build.py): the float32 model never exists whole,
and the weights are those of an ordinary build with the same seed.

Which layers: every `torch.nn.Linear` (and Hugging Face's `Conv1D`, transposed) except those named
in `skip_modules` and those whose weight is tied to another module (a language model's head tied
to its embedding: quantizing it would untie them). Checkpoints hold the quantized form and load
back bit-exact; a float weight loading into a quantized layer (pretrained weights, a checkpoint of
an unquantized run) is quantized as it loads (framework/precision/quantized_layers.py).
"""
from __future__ import annotations

import fnmatch

import torch

from framework.errors import ConfigError
from framework.precision.base import Precision
from framework.precision.quantized_layers import layer_classes

COMPUTE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _is_linear(module: torch.nn.Module) -> bool:
    if type(module) is torch.nn.Linear:
        return True
    # transformers' Conv1D (GPT-2): a linear layer with its weight stored (in, out)
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and getattr(module, "weight", None) is not None


def _shape(module: torch.nn.Module) -> tuple[int, int, bool]:
    """(in_features, out_features, transposed) of a linear-like module."""
    if type(module) is torch.nn.Linear:
        return module.in_features, module.out_features, False
    n_in, n_out = module.weight.shape
    return n_in, n_out, True


def _tied_weights(model: torch.nn.Module) -> set[int]:
    seen: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        seen[id(param)] = seen.get(id(param), 0) + 1
    return {key for key, count in seen.items() if count > 1}


class QuantizedPrecision(Precision):
    """Frozen quantized linear layers through bitsandbytes; subclasses name the format."""

    #: bitsandbytes' layers run their own kernels, which torch.compile does not trace
    supports_compile = False

    #: "int8", "nf4" or "fp4"
    quantization: str = "nf4"
    #: whether the 4-bit blocks' scales are quantized again (QLoRA's double quantization)
    double_quant: bool = False
    #: bits per frozen weight, statistics included (for `framework plan`)
    bits_per_weight: float = 4.5
    #: the Python package these precisions need (the compatibility table checks it is installed)
    python_package = "bitsandbytes"
    install_hint = "pip install 'framework[quant]'"
    #: freed float weights (a float layer once quantized, temporaries) go back to the OS (measured on
    #: an 85M GPT: training peak 0.22x of precision=32's instead of 0.31x for nf4)
    saves_memory = True

    def __init__(self, compute_dtype: str = "bf16", skip_modules: list[str] | None = None, block_size: int = 64):
        """compute_dtype: what the 4-bit layers compute in (bf16, fp16 or fp32; int8 layers compute in
        int8); skip_modules: layers kept unquantized and trainable, by qualified name, its
        dotted ending or a glob (`lm_head`, `mlp.c_proj`, `blocks.0.*`); block_size: weights per 4-bit scale."""
        super().__init__()
        if compute_dtype not in COMPUTE_DTYPES:
            raise ConfigError(f"precision.compute_dtype={compute_dtype!r}: use one of {', '.join(COMPUTE_DTYPES)}.")
        self.compute_dtype_name = compute_dtype
        self.skip_modules = list(skip_modules or [])
        self.block_size = block_size
        self.conversion_note = ""

    @property
    def compute_dtype(self) -> torch.dtype:  # type: ignore[override]
        return torch.float32 if self.quantization == "int8" else COMPUTE_DTYPES[self.compute_dtype_name]

    # ---- which layers ---------------------------------------------------------------------
    @staticmethod
    def _matches(name: str, pattern: str) -> bool:
        return name == pattern or name.endswith("." + pattern) or fnmatch.fnmatchcase(name, pattern)

    def _skipped_by_name(self, name: str) -> bool:
        return any(self._matches(name, pattern) for pattern in self.skip_modules)

    def plan_layers(self, model: torch.nn.Module) -> tuple[list[str], list[str]]:
        """(names of the linear layers to quantize, names of those kept with the reason)."""
        tied = _tied_weights(model)
        # an adapted model (QLoRA): its frozen layers are quantized, the adapters' own layers train
        adapted = any(not p.requires_grad for p in model.parameters())
        chosen, kept = [], []
        for name, module in model.named_modules():
            if not _is_linear(module):
                continue
            if adapted and module.weight.requires_grad:
                continue  # an adapter's layer (not listed: there are two per adapted layer)
            if self._skipped_by_name(name):
                kept.append(f"{name} (skip_modules)")
            elif id(module.weight) in tied:
                kept.append(f"{name} (weight tied to another module)")
            else:
                chosen.append(name)
        return chosen, kept

    def model_problems(self, model: torch.nn.Module) -> list[str]:
        names = [name for name, module in model.named_modules() if _is_linear(module)]
        problems = []
        for pattern in self.skip_modules:
            if not any(self._matches(name, pattern) for name in names):
                problems.append(f"precision.skip_modules: {pattern!r} names no linear layer of the model (it has: "
                                f"{', '.join(names[:8])}{', ...' if len(names) > 8 else ''}); fix or remove it.")
        if not self.plan_layers(model)[0] and not problems:
            problems.append(f"precision={self.name}: the model has no torch.nn.Linear layer to quantize (all are "
                            "skipped or tied, or it has none); use precision=32 or bf16.")
        return problems

    def frozen_weights(self, model: torch.nn.Module) -> tuple[int, int]:
        """(parameters frozen by the quantization, their bytes once quantized), for `framework plan`."""
        modules = dict(model.named_modules())
        count = sum(modules[name].weight.numel() for name in self.plan_layers(model)[0])
        return count, int(count * self.bits_per_weight / 8)

    # ---- conversion ----------------------------------------------------------------------
    #: the strategy builds the model with the chosen layers quantized as they are made
    #: (framework/construction/quantized_build.py), so the float32 model never exists whole
    quantizes_while_building = True

    def quantized_layer(self, module: torch.nn.Module) -> torch.nn.Module:
        """The quantized layer for one float linear layer (its weights quantized, bias copied)."""
        n_in, n_out, transposed = _shape(module)
        bias = module.bias is not None
        device = module.weight.device
        # the layer's own constructor initialises a float weight it never keeps: its random numbers
        # must not shift the run's RNG stream (the model's weights, dropout masks after set-up)
        with torch.random.fork_rng(devices=[]):
            if self.quantization == "int8":
                layer = layer_classes()["int8"](n_in, n_out, bias=bias, has_fp16_weights=False, device=device)
            else:
                layer = layer_classes()["4bit"](n_in, n_out, bias=bias, compute_dtype=self.compute_dtype,
                                                compress_statistics=self.double_quant, quant_type=self.quantization,
                                                device=device)
        if self.quantization != "int8":
            layer.weight.blocksize = self.block_size
        layer.transposed_source = transposed
        weight = module.weight.detach()
        layer.quantize_from(weight.t() if transposed else weight)
        if bias:
            layer.bias = torch.nn.Parameter(module.bias.detach().to(torch.float32),
                                            requires_grad=module.bias.requires_grad)
        return layer

    def convert_module(self, model: torch.nn.Module) -> torch.nn.Module:
        chosen, kept = self.plan_layers(model)
        modules = dict(model.named_modules())
        for name in chosen:  # one layer at a time: its float weight is freed as the next one is made
            parent_name, _, child = name.rpartition(".")
            setattr(modules[parent_name] if parent_name else model, child, self.quantized_layer(modules[name]))
        quantized = [m for m in model.modules() if hasattr(m, "dequantized_weight")]  # here or while building
        frozen = sum(layer.in_features * layer.out_features for layer in quantized)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        bits = "int8" if self.quantization == "int8" else f"4-bit {self.quantization}" + (
            " (double quantization)" if self.double_quant else "")
        self.conversion_note = (f"precision={self.name}: {len(quantized)} linear layers quantized to {bits}, "
                                f"{frozen / 1e6:.2f}M weights frozen; {trainable / 1e6:.2f}M parameters train"
                                + (f"; kept unquantized: {', '.join(kept)}" if kept else ""))
        return model

    def __repr__(self) -> str:
        return f"{type(self).__name__}(compute_dtype={self.compute_dtype_name}, skip_modules={self.skip_modules})"
