"""`adapter=lora`: low-rank adapters on chosen linear layers, the rest of the model frozen, built by
peft (the well-kept library: no LoRA layer is written here).

Each target `nn.Linear` W gets W + (alpha / r) B A with A (r x in) and B (out x r), B starting at
zero, so training starts from the model's own outputs. Targets are module names or globs
(`blocks.*.attn.qkv`) or the last part of a name (`qkv`); by default the attention and MLP
projections of the model's family (the built-in GPT, GPT-2, Llama, Qwen2). `modules_to_save`
trains whole modules too (a new head). With `precision=bnb_nf4` the frozen layers are 4-bit: QLoRA.

The adapted model keeps its class (peft injects its layers in place), so tasks, strategies and
sharding units see the same model; a frozen weight `x.weight` becomes `x.base_layer.weight`.
A checkpoint holds the trainable weights and their optimizer state only (framework/loop/fit_loop.py).
"""
from __future__ import annotations

import fnmatch
import importlib.util
import math
import zlib
from contextlib import contextmanager

import torch
from torch import nn

from framework.config.types import NonNegativeFloat, PositiveFloat, PositiveInt
from framework.errors import ConfigError, did_you_mean
from framework.precision.quantized_layers import quiet_bitsandbytes


def peft_package():
    """peft, imported for every use the framework makes of it (training, merging, exporting): peft
    imports bitsandbytes where it is installed, so the framework's quiet import of bitsandbytes
    comes first (its CPU backend's note about optional hub kernels is expected here, never shown)."""
    if importlib.util.find_spec("bitsandbytes") is not None:
        quiet_bitsandbytes()
    return importlib.import_module("peft")


# Attention and MLP projections of each family (the last part of the module name); a default that
# matches nothing in a given model is left out (the built-in GPT's dense MLPs where every Block is
# a mixture of experts). The routed experts of a mixture are stacked weights, not linear layers:
# they stay frozen; its shared experts, the attention and dense MLPs take adapters.
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
DEFAULT_TARGETS = {
    "GPT": ["qkv", "proj", "mlp.0", "mlp.2", "moe.shared.0", "moe.shared.2"],  # framework/models/gpt.py
    "gpt2": ["c_attn", "c_proj", "c_fc"],
    "llama": [*ATTENTION, "gate_proj", "up_proj", "down_proj"],
    "qwen2": [*ATTENTION, "gate_proj", "up_proj", "down_proj"],
    "qwen3_moe": ATTENTION, "mixtral": ATTENTION, "olmoe": ATTENTION,
}
LINEAR_TYPES = ("Linear", "Conv1D", "Linear4bit", "Linear8bitLt")  # what peft's LoRA wraps (Conv1D: GPT-2's)


def family(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return str(getattr(config, "model_type", None) or type(model).__name__)


def is_linear(module: nn.Module) -> bool:
    """A layer peft's LoRA wraps (by class name, through its bases: the framework's quantized layers
    are bitsandbytes' Linear4bit and Linear8bitLt)."""
    return any(cls.__name__ in LINEAR_TYPES for cls in type(module).__mro__)


def linear_names(model: nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if name and is_linear(module)]


def is_adapted(model: nn.Module) -> bool:
    """Whether peft injected adapters into the model."""
    return hasattr(model, "peft_config")


@contextmanager
def adapters_off(model: nn.Module):
    """The model as it was before its adapters (a preference task's reference, free: no second
    copy): every adapter layer skipped while inside. Only the flag peft's forward reads is turned
    (not requires_grad, which a sharded step keeps); a module trained whole (modules_to_save) is
    not undone: such a run is refused a reference this way (framework/tasks/preference.py)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    if not layers:  # the reference would silently be the trained model itself
        raise ConfigError("the trained model has no adapters to turn off for its reference (adapter=lora); give the "
                          "reference as a model of its own (task.reference=<a directory>).")
    before = [layer._disable_adapters for layer in layers]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield model
    finally:
        for layer, was in zip(layers, before):
            layer._disable_adapters = was


def trainable_names(model: nn.Module) -> set[str]:
    """The names of the model's parameters that train (an adapter run's checkpoint keeps those); a
    pipeline rank's part of a model knows the whole model's (framework/construction/stage_modules.py)."""
    whole = getattr(model, "whole_trainable_names", None)
    return set(whole) if whole is not None else {name for name, p in model.named_parameters() if p.requires_grad}


class LoRA:
    """Low-rank adapters on the model's linear layers (peft's LoRA, or DoRA with use_dora)."""

    requires_packages = {"peft": "'framework[peft]'"}
    name = "lora"

    def __init__(self, r: PositiveInt = 8, alpha: PositiveFloat = 16.0, dropout: NonNegativeFloat = 0.0,
                 target_modules: list[str] | None = None, modules_to_save: list[str] | None = None,
                 use_dora: bool = False):
        """r: the adapters' rank; alpha: their scale is alpha / r; dropout: on the adapters' input;
        target_modules: module names, globs, or last parts of names of the linear layers to adapt
        (null: the family's attention and MLP projections); modules_to_save: modules trained whole
        besides (e.g. a new head); use_dora: weight-decomposed LoRA (DoRA)."""
        self.r, self.alpha, self.dropout, self.use_dora = r, alpha, dropout, use_dora
        self.target_modules = list(target_modules) if target_modules else None
        self.modules_to_save = list(modules_to_save or [])

    def targets(self, model: nn.Module) -> list[str]:
        """The full names of the linear layers to adapt; every way the choice can miss is refused."""
        linear = linear_names(model)
        if not linear:
            raise ConfigError(f"adapter=lora: the model ({type(model).__name__}) has no linear layer to adapt; LoRA "
                              "needs nn.Linear layers (choose another model, or adapter=null).")
        patterns = self.target_modules or DEFAULT_TARGETS.get(family(model))
        if patterns is None:
            raise ConfigError(f"adapter.target_modules: no default for a {family(model)} model; name its layers, e.g. "
                              f"adapter.target_modules=[{', '.join(sorted({n.rsplit('.', 1)[-1] for n in linear})[:4])}]"
                              f" (its linear layers: {', '.join(linear[:8])}{' ...' if len(linear) > 8 else ''}).")
        chosen, unmatched = [], []
        for pattern in patterns:
            found = [n for n in linear if fnmatch.fnmatchcase(n, pattern) or n == pattern
                     or n.endswith("." + pattern)]
            chosen += found
            if not found:
                unmatched.append(pattern)
        if self.target_modules is None:
            unmatched = []  # a family's default the model does not have
        experts = [p for p in unmatched if "expert" in p and "shared" not in p]
        if experts:
            raise ConfigError(f"adapter.target_modules: {', '.join(map(repr, experts))}: a mixture's routed experts "
                              "are stacked weights (one tensor for all experts), not linear layers, and LoRA here "
                              "adapts linear layers only; adapt the attention and shared experts (the default), or "
                              "train the experts whole with adapter=null.")
        if unmatched:
            leaves = sorted({n.split(".")[-1] for n in linear} | {".".join(n.split(".")[-2:]) for n in linear})
            hints = " ".join(did_you_mean(p, leaves) for p in unmatched).strip()
            raise ConfigError(f"adapter.target_modules: {', '.join(map(repr, unmatched))} match no linear layer of "
                              f"the model. {hints + ' ' if hints else ''}Its linear layers: {', '.join(linear[:10])}"
                              f"{' ...' if len(linear) > 10 else ''}.")
        chosen = list(dict.fromkeys(chosen))
        modules = dict(model.named_modules())
        for name in chosen:
            smallest = min(_dims(modules[name]))
            if self.r > smallest:
                raise ConfigError(f"adapter.r={self.r}: larger than {name}'s smaller dimension ({smallest}); a rank "
                                  f"above it adds nothing. Use adapter.r={smallest} or less.")
        return chosen

    def apply(self, model: nn.Module) -> nn.Module:
        """The model with adapters injected (in place) and everything else frozen."""
        peft = peft_package()
        LoraConfig, inject_adapter_in_model = peft.LoraConfig, peft.inject_adapter_in_model

        targets = self.targets(model)
        missing = [m for m in self.modules_to_save if m not in dict(model.named_modules())]
        if missing:
            raise ConfigError(f"adapter.modules_to_save: {', '.join(missing)} is no module of the model.")
        config = LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout, target_modules=targets,
                            use_dora=self.use_dora, bias="none", fan_in_fan_out=fan_in_fan_out(model, targets))
        model = inject_adapter_in_model(config, model)
        for name, parameter in model.named_parameters():
            # peft makes an adapter in its base layer's compute dtype: bfloat16 over bitsandbytes' 4-bit
            # layers (QLoRA), and the optimizer's moments then follow. The adapters stay float32; their
            # input is cast to them and their output back (peft's LoRA forward).
            if "lora_" in name and parameter.dtype in (torch.bfloat16, torch.float16):
                parameter.data = parameter.data.float()
        initialise_adapters(model)
        for name, parameter in model.named_parameters():
            parameter.requires_grad = "lora_" in name or any(name.startswith(m + ".") for m in self.modules_to_save)
        return model


def initialise_adapters(model: nn.Module) -> None:
    """Each adapter's A drawn as peft draws it (Kaiming-uniform; B stays zero), from a generator of
    its own, seeded by the run's seed and the layer's name: the same adapters for the same seed
    under every strategy and precision. peft draws from the global generator, whose state at that
    moment depends on how the model was built (measured: fsdp's meta build, ZeRO-3's partitioned
    one and QLoRA's quantized one started from other A values, up to 0.246 apart). On the meta
    device the draw is recorded and replayed into the shards like every initialiser."""
    seed = torch.initial_seed()
    for name, parameter in model.named_parameters():
        if ".lora_A." in name:
            layer_seed = (seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 63)
            torch.nn.init.kaiming_uniform_(parameter, a=math.sqrt(5),
                                           generator=torch.Generator().manual_seed(layer_seed))


def fan_in_fan_out(model: nn.Module, targets: list[str]) -> bool:
    """Whether the targets store their weight as (in, out): GPT-2's Conv1D layers (peft needs to be
    told, else it warns once per layer and sets it itself)."""
    modules = dict(model.named_modules())
    return any(type(modules[name]).__name__ == "Conv1D" for name in targets)


def _dims(module: nn.Module) -> tuple[int, int]:
    weight = getattr(module, "weight", None)
    if weight is None:
        return (0, 0)
    # the full shape: ZeRO-3 partitions a weight as it is made (ds_shape), bitsandbytes packs it (quant_state)
    quant_state = getattr(weight, "quant_state", None)
    shape = tuple(getattr(weight, "ds_shape", None) or (quant_state.shape if quant_state is not None else weight.shape))
    return (int(shape[0]), int(shape[-1])) if len(shape) >= 2 else (int(shape[0]), int(shape[0]))


def base_name(name: str) -> str:
    """A frozen weight's name in the model before adapters (`x.base_layer.weight` -> `x.weight`)."""
    return name.replace(".base_layer.", ".")


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, frozen) parameter counts (each tied parameter once)."""
    seen, trainable, frozen = set(), 0, 0
    for parameter in model.parameters():
        if id(parameter) in seen:
            continue
        seen.add(id(parameter))
        if parameter.requires_grad:
            trainable += parameter.numel()
        else:
            frozen += parameter.numel()
    return trainable, frozen
