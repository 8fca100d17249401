"""bitsandbytes linear layers whose frozen weight loads from either of two forms, for the
quantized precisions (framework/precision/quantized.py).

A checkpoint of a quantized run stores the weights as bitsandbytes does (packed 4-bit or int8
values plus their quantization statistics: ~1/8 or 1/4 of float32), and loads back bit-exact.
A float weight of the layer's shape (the model's own weights, pretrained weights, a checkpoint of
an unquantized run) is quantized as it loads. The bias stays a trainable float32 parameter:
bitsandbytes' own forward casts it in place to the compute dtype, under the optimizer's feet.

bitsandbytes is imported only when one of these precisions is chosen (`layer_classes()`).
"""
from __future__ import annotations

import logging
from functools import cache

import torch


def _pop_quant_stats(state_dict: dict, weight_key: str) -> dict:
    """The quantization statistics stored beside a weight (`<weight>.absmax`, ...), removed from
    the state dict so that the module's own loader does not see them."""
    stats = {}
    for key in [k for k in state_dict if k.startswith(weight_key + ".")]:
        stats[key[len(weight_key) + 1:]] = state_dict.pop(key)
    return stats


def _float_weight(layer: torch.nn.Module, incoming: torch.Tensor, key: str) -> torch.Tensor:
    """A float weight for `layer` from a state dict: (out, in), or (in, out) for a layer made
    from a transposed source (Hugging Face's Conv1D)."""
    expected = (layer.out_features, layer.in_features)
    if layer.transposed_source and tuple(incoming.shape) == expected[::-1]:
        incoming = incoming.t()
    if tuple(incoming.shape) != expected:
        raise RuntimeError(f"{key}: a weight of shape {tuple(incoming.shape)} cannot load into a quantized layer "
                           f"of shape {expected}")
    return incoming.contiguous()


TRANSPOSED = "weight_transposed"


class _QuantizedLayer:
    """What both layer kinds share: loading the weight in either form (each kind's
    `_load_weight(state_dict, key, error_msgs)` loads `key`, quantized or float, popping what it
    used, and says whether the weight was there), and the orientation of their source: a layer
    made from a module that stores its weight (in, out) (Hugging Face's Conv1D) says so in its
    state dict (`<layer>.weight_transposed`), so that its weights dequantize back to the
    orientation of the module they came from (framework convert, another precision's model)."""

    transposed_source = False

    @property
    def weight_transposed(self) -> torch.Tensor:  # found by getattr: DCP's state-dict API
        return torch.tensor(self.transposed_source)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.transposed_source:
            destination[prefix + TRANSPOSED] = self.weight_transposed

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        key = prefix + "weight"
        state_dict = dict(state_dict)
        state_dict.pop(prefix + TRANSPOSED, None)
        loaded = self._load_weight(state_dict, key, error_msgs)
        # the bias (and anything unexpected) as any module loads it; bitsandbytes' own loaders expect
        # the weight in one form only
        torch.nn.Module._load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                                              unexpected_keys, error_msgs)
        if loaded and key in missing_keys:
            missing_keys.remove(key)


@cache
def quiet_bitsandbytes():
    """bitsandbytes, imported on first use without two expected notes."""
    # Its CPU backend logs a warning when the optional `kernels` package (kernels fetched from the
    # Hugging Face hub) is absent; the framework never fetches code at run time, so that is expected.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    # LLM.int8() quantizes its float32 inputs through float16 by design; bitsandbytes says so once per run
    logging.getLogger("bitsandbytes.autograd._functions").addFilter(
        lambda record: not record.getMessage().startswith("MatMul8bitLt: inputs will be cast"))
    import bitsandbytes

    return bitsandbytes


@cache
def layer_classes() -> dict:
    """{"4bit": Quantized4bitLinear, "int8": QuantizedInt8Linear}, built on first use."""
    bnb = quiet_bitsandbytes()
    from bitsandbytes.functional import QuantState, int8_vectorwise_quant
    from bitsandbytes.nn.modules import fix_4bit_weight_quant_state_from_module

    class Quantized4bitLinear(_QuantizedLayer, bnb.nn.Linear4bit):
        """nf4 / fp4 weights (optionally double-quantized statistics), frozen; computes in
        `compute_dtype` and returns the input's dtype."""

        def quantize_from(self, weight: torch.Tensor) -> None:
            quantized = bnb.nn.Params4bit(
                weight.detach().to(torch.float32), requires_grad=False, blocksize=self.weight.blocksize,
                compress_statistics=self.weight.compress_statistics, quant_type=self.weight.quant_type,
                quant_storage=self.quant_storage,
            )._quantize(weight.device)
            self._set_4bit(quantized.data, quantized.quant_state)

        def _set_4bit(self, packed: torch.Tensor, quant_state) -> None:
            # in place: the optimizer and the strategy's name maps hold this Parameter object
            self.weight.data = packed
            self.weight.quant_state = self.quant_state = quant_state
            self.weight.blocksize, self.weight.quant_type = quant_state.blocksize, quant_state.quant_type
            self.weight.compress_statistics = quant_state.nested
            self.weight.bnb_quantized = True

        def dequantized_weight(self) -> torch.Tensor:
            return bnb.functional.dequantize_4bit(self.weight.data, self.weight.quant_state).to(torch.float32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            fix_4bit_weight_quant_state_from_module(self)  # a quant state lost by a copy of the weight
            out = bnb.matmul_4bit(x.to(self.compute_dtype), self.weight, quant_state=self.weight.quant_state)
            out = out.to(x.dtype)
            return out + self.bias.to(x.dtype) if self.bias is not None else out

        def _load_weight(self, state_dict: dict, key: str, error_msgs: list) -> bool:
            stats = _pop_quant_stats(state_dict, key)
            incoming = state_dict.pop(key, None)
            if incoming is None:
                return False
            try:
                if stats:
                    device = self.weight.device
                    self._set_4bit(incoming.to(device).contiguous(), QuantState.from_dict(stats, device=device))
                elif incoming.is_floating_point():
                    self.quantize_from(_float_weight(self, incoming.to(self.weight.device), key))
                else:
                    error_msgs.append(f"{key}: packed 4-bit values without their quantization statistics")
            except (RuntimeError, KeyError, ValueError) as err:
                error_msgs.append(f"{key}: {err}")
            return True

    class QuantizedInt8Linear(_QuantizedLayer, bnb.nn.Linear8bitLt):
        """LLM.int8() weights (int8 per row + a float scale per row), frozen."""

        def quantize_from(self, weight: torch.Tensor) -> None:
            int8, scale, _ = int8_vectorwise_quant(weight.detach().to(torch.float16).contiguous())
            self._set_int8(int8, scale)

        def _set_int8(self, int8: torch.Tensor, scale: torch.Tensor) -> None:
            # in place: the optimizer and the strategy's name maps hold this Parameter object
            self.weight.data = int8
            self.weight.CB, self.weight.SCB = int8, scale
            self.state.CB, self.state.SCB = None, None  # forward hands them over from the weight

        def _apply(self, fn, recurse: bool = True):
            """Module.to moves `weight.data` alone; the int8 values and row scales bitsandbytes reads
            beside it (`weight.CB`, `weight.SCB`, and the state's) stayed where the layer was
            quantized, the CPU: on CUDA the int8 matmul then failed ("Expected a cuda device, but
            got: cpu", measured on an H100). They follow the weight's device; the scales keep
            float32 whatever dtype a cast asks for."""
            super()._apply(fn, recurse)
            device = self.weight.device
            for holder in (self.weight, self.state):
                if getattr(holder, "CB", None) is not None:
                    holder.CB = self.weight.data  # the int8 values are the weight's
                if getattr(holder, "SCB", None) is not None:
                    holder.SCB = holder.SCB.to(device)
            return self

        # torch.distributed.checkpoint's state-dict API finds each saved key by getattr
        @property
        def SCB(self) -> torch.Tensor:  # noqa: N802 (bitsandbytes' name for the row scales)
            return self.weight.SCB if self.weight.SCB is not None else self.state.SCB

        @property
        def weight_format(self) -> torch.Tensor:
            return torch.tensor(0, dtype=torch.uint8)  # row-major, the only format bitsandbytes still writes

        def dequantized_weight(self) -> torch.Tensor:
            int8, scale = self.weight.data, self.SCB
            return int8.to(torch.float32) * (scale.to(torch.float32).unsqueeze(1) / 127.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.state.is_training = self.training
            if self.weight.CB is not None:
                self.init_8bit_state()
            out = bnb.matmul(x, self.weight, state=self.state)
            if self.state.CB is not None:
                self.weight.data = self.state.CB
            return out + self.bias.to(out.dtype) if self.bias is not None else out

        def _load_weight(self, state_dict: dict, key: str, error_msgs: list) -> bool:
            prefix = key[: -len("weight")]
            scale = state_dict.pop(prefix + "SCB", None)
            state_dict.pop(prefix + "weight_format", None)
            incoming = state_dict.pop(key, None)
            if incoming is None:
                return False
            device = self.weight.device
            if incoming.dtype == torch.int8 and scale is not None:
                self._set_int8(incoming.to(device).contiguous(), scale.to(device))
            elif incoming.is_floating_point():
                try:
                    self.quantize_from(_float_weight(self, incoming.to(device), key))
                except RuntimeError as err:
                    error_msgs.append(str(err))
            else:
                error_msgs.append(f"{key}: int8 values without their scales ({prefix}SCB)")
            return True

    return {"4bit": Quantized4bitLinear, "int8": QuantizedInt8Linear}


def quantized_weight_keys(state: dict) -> dict[str, str]:
    """{weight key: "4bit" | "int8"} for every weight a quantized precision stored in `state`."""
    found = {}
    for key in state:
        if ".quant_state.bitsandbytes__" in key:
            found[key.split(".quant_state.", 1)[0]] = "4bit"
        elif key.endswith(".SCB") and key[:-3] + "weight" in state:
            found[key[:-3] + "weight"] = "int8"
    return found


def dequantize_weights(state: dict, keys: dict[str, str]) -> dict:
    """`state` with the quantized weights named in `keys` (from `quantized_weight_keys`) replaced by
    float32 weights, the values the quantized layers computed with, shaped as the module they were
    made from stored them, and their statistics removed: a quantized run's checkpoint for a model
    without quantized layers."""
    state = dict(state)
    for key, kind in keys.items():
        prefix = key[: -len("weight")]
        transposed = bool(state.pop(prefix + TRANSPOSED, torch.tensor(False)).item())
        if kind == "int8":
            scale = state.pop(prefix + "SCB").to(torch.float32)
            state.pop(prefix + "weight_format", None)
            state[key] = state[key].to(torch.float32) * (scale.unsqueeze(1) / 127.0)
        else:
            functional = quiet_bitsandbytes().functional
            stats = _pop_quant_stats(state, key)
            quant_state = functional.QuantState.from_dict(qs_dict=stats, device=state[key].device)
            state[key] = functional.dequantize_4bit(state[key], quant_state).to(torch.float32)
        if transposed:
            state[key] = state[key].t().contiguous()
    return state
