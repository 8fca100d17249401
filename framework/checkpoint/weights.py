"""Plain weights as a starting point: `ckpt_path=model.safetensors` (or a torch state_dict file,
`.pt`/`.pth`/`.bin`): weights only, a fresh optimizer, step 0.

Files are mapped, not read: a safetensors file's tensors are zero-copy views of the mapped file
(its header gives each tensor's offset), a torch file is loaded with `mmap=True`. A sharding
strategy then copies only its own slice of each tensor (fsdp: `distribute_tensor`; ZeRO-3: its
partition), so a rank touches the pages of its shards, not the whole model; the page cache is
shared by the ranks of a node. Loads never unpickle arbitrary objects (weights_only).
"""
from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import torch

from framework.construction.named_state import ADAPTER_WEIGHTS
from framework.errors import CheckpointError
from framework.precision.quantized_layers import dequantize_weights, quantized_weight_keys

SAFETENSORS = (".safetensors",)
TORCH_FILES = (".pt", ".pth", ".bin")
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def is_weights_file(path: Path) -> bool:
    return path.is_file() and path.suffix in SAFETENSORS + TORCH_FILES


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file as a view of the mapped file (nothing is copied); tied
    names the framework's export recorded in the metadata point to the same tensor."""
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # private: writable views, no copy made
    try:
        (length,) = struct.unpack("<Q", mapped[:8])
        header = json.loads(mapped[8:8 + length])
    except (struct.error, ValueError) as err:
        raise CheckpointError(f"{path}: not a safetensors file (its header does not parse: {err}).") from err
    start = 8 + length
    metadata = header.pop("__metadata__", {}) or {}
    state = {}
    for name, info in header.items():
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise CheckpointError(f"{path}: tensor {name} has dtype {info['dtype']}, which the framework does not read.")
        begin, end = info["data_offsets"]
        if start + end > len(mapped):
            raise CheckpointError(f"{path} is truncated: tensor {name} ends at byte {start + end} of {len(mapped)}.")
        count = (end - begin) // torch.empty((), dtype=dtype).element_size()
        flat = torch.frombuffer(mapped, dtype=dtype, count=count, offset=start + begin) if count else \
            torch.empty(0, dtype=dtype)
        state[name] = flat.view(info["shape"])
    for name, same_as in json.loads(metadata.get("tied", "{}")).items():
        state.setdefault(name, state[same_as])
    return state


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """A plain state_dict file, mapped (see the module docstring)."""
    if path.suffix in SAFETENSORS:
        return read_safetensors(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # a corrupt or pickled-object file: refused, named
        raise CheckpointError(f"{path}: not a plain state_dict that loads safely ({str(err).splitlines()[0]}).") from err
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: holds a {type(state).__name__}, not a state_dict of tensors by name.")
    return state


def initial_weights(model: torch.nn.Module, files: list[str]) -> dict[str, torch.Tensor]:
    """The state_dict a model's `pretrained_weights` files give it (every shard file merged,
    mapped, nothing copied), under the model's own names: a name saved without the model's
    `base_model_prefix` (Hugging Face's bare-backbone checkpoints, e.g. GPT-2's `h.0...` for
    `transformer.h.0...`) or with it is matched either way, and a tied parameter the files store
    once is given under each of its names. A parameter the files lack is refused, named."""
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(read_weights(Path(file)))
    prefix = getattr(model, "base_model_prefix", "") or ""
    names: dict[int, list[str]] = {}
    for name, tensor in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        names.setdefault(id(tensor), []).append(name)
    wanted = {name for group in names.values() for name in group}
    adapted = _adapted_names(wanted)
    mapped: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        for candidate in (key, f"{prefix}.{key}", key.removeprefix(f"{prefix}.")):
            if candidate in wanted or candidate in adapted:
                mapped[adapted.get(candidate, candidate)] = tensor
                break
    for group in names.values():  # tied: one stored tensor serves every name of the parameter
        found = next((mapped[n] for n in group if n in mapped), None)
        for name in group:
            if found is not None:
                mapped.setdefault(name, found)
    missing = sorted(n for n in wanted if n not in mapped and not _optional_buffer(model, n)
                     and not any(marker in n for marker in ADAPTER_WEIGHTS))  # an adapter's own: newer than the files
    if missing:
        raise CheckpointError(f"{files[0]}: no weights for {len(missing)} of the model's tensors (first: "
                              f"{missing[0]}); the files were saved from another architecture or config.")
    return mapped


def _adapted_names(names) -> dict[str, str]:
    """{a weight's name before adapters: its name in the adapted model} (peft moves an adapted
    layer's own weight to `<layer>.base_layer.weight`)."""
    return {name.replace(".base_layer.", "."): name for name in names if ".base_layer." in name}


def _optional_buffer(model: torch.nn.Module, name: str) -> bool:
    """A non-persistent buffer (computed, e.g. rotary frequencies) is not in a weights file."""
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner)
    return leaf in getattr(module, "_non_persistent_buffers_set", set())


def fit_saved_state(model: torch.nn.Module, state: dict) -> dict:
    """A saved model state made to fit `model`'s layers when another precision saved it, or before
    adapters were added (its weights moved to the adapted layers' `base_layer` names):
    - weights of a quantized run (precision=bnb_*) for layers that are not quantized here (another
      precision, or a layer now in skip_modules) dequantized to float32, the values the quantized
      run computed with; quantized layers load the stored form themselves (bit-exact);
    - TransformerEngine's fp8 scaling state (`<layer>._extra_state`, precision=te_fp8) dropped
      for a model whose layers have none."""
    adapted = _adapted_names(dict(model.named_parameters()))
    if adapted:  # weights saved before adapters were added: under the adapted layers' names
        state = {adapted.get(k, k): v for k, v in state.items()}
    extra = [k for k in state if k.endswith("_extra_state")]
    if extra:
        own = set(model.state_dict())
        state = {k: v for k, v in state.items() if k in own or k not in extra}
    keys = quantized_weight_keys(state)
    if not keys:
        return state
    modules = dict(model.named_modules())
    plain = {key: kind for key, kind in keys.items()
             if not hasattr(modules.get(key[: -len(".weight")]), "dequantized_weight")}
    return dequantize_weights(state, plain) if plain else state


def load_error_summary(err: Exception, limit: int = 400) -> str:
    """torch's load_state_dict error in one line: its header and the first missing / unexpected /
    mismatched entries (the full text lists every key, one paragraph per module)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    summary = " ".join(lines[:3]) if lines else type(err).__name__
    return summary if len(summary) <= limit else summary[: limit - 3] + "..."
