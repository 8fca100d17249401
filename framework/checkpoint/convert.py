"""`framework convert`: a checkpoint to a plain state_dict for inference, and a DeepSpeed native
checkpoint into this framework's format."""
from __future__ import annotations

import json
from pathlib import Path

from framework.checkpoint.format import (
    FORMAT_VERSION,
    META,
    check_files,
    is_sharded,
    read_meta,
    sharded_files,
    versions,
)
from framework.checkpoint.storage import readable_by_others, stored_once
from framework.checkpoint_io.dcp_reader import STATE_DIR, read_full
from framework.checkpoint_io.torch import TorchCheckpointIO
from framework.errors import CheckpointError, ConfigError
from framework.precision.quantized_layers import dequantize_weights, quantized_weight_keys
from framework.strategy.deepspeed.imports import deepspeed_package

FORMATS = ("torch", "safetensors")


def read_model_state(checkpoint: Path) -> tuple[dict, dict]:
    """(meta.json, the full model state_dict) of a checkpoint directory, sharded or not; the weights
    of a quantized run (precision=bnb_*) dequantized to float32 (out, in), as plain weights are."""
    meta = read_meta(checkpoint)
    if is_sharded(meta):  # checkpoint_io=dcp: gather the shards of every rank into full tensors
        check_files(checkpoint, meta, sharded_files(meta))
        state = read_full(checkpoint / STATE_DIR, ("model",))["model"]
    else:
        check_files(checkpoint, meta, ["model.pt"])
        state = TorchCheckpointIO().load(checkpoint / "model.pt")
    quantized = quantized_weight_keys(state)
    return meta, dequantize_weights(state, quantized) if quantized else state


def export_weights(checkpoint: Path, out: Path, to: str = "torch", state: dict | None = None) -> Path:
    """Write the model weights of `checkpoint` (a checkpoint directory of this framework) as a
    plain state_dict: `torch` (torch.save, loads with weights_only) or `safetensors`. `state`: the
    weights to write instead of the checkpoint's own (an adapter run's, merged)."""
    meta, saved = read_model_state(checkpoint)
    state = saved if state is None else state
    out.parent.mkdir(parents=True, exist_ok=True)
    if to == "torch":
        TorchCheckpointIO().save(state, out)
    elif to == "safetensors":
        try:
            from safetensors.torch import save_file
        except ImportError as err:
            raise ConfigError("--to safetensors needs the safetensors package: pip install safetensors") from err
        unique, tied = stored_once(state)
        save_file(unique, str(out), metadata={"framework_step": str(meta["step"]), "tied": json.dumps(tied)})
        readable_by_others(out)
    else:
        raise ConfigError(f"--to {to}: choose one of {', '.join(FORMATS)}.")
    return out


def write_weights_checkpoint(state: dict, out: Path, meta: dict) -> Path:
    """`state` as a checkpoint directory of this framework holding weights alone (model.pt and its
    meta.json, `meta` added): what `ckpt_path`, `task.teacher`, `task.reference` and the commands
    after training read; a run started from it begins a fresh optimizer."""
    out.mkdir(parents=True, exist_ok=False)
    TorchCheckpointIO().save({k: v.contiguous() for k, v in state.items()}, out / "model.pt")
    written = {"format_version": FORMAT_VERSION, "step": 0, "epoch": 0, "world_size": 1, "versions": versions(),
               **meta, "weights_only": True, "files": {"model.pt": (out / "model.pt").stat().st_size}}
    (out / META).write_text(json.dumps(written, indent=2))
    return out


def import_deepspeed(ds_dir: Path, out: Path, tag: str | None = None) -> Path:
    """A DeepSpeed native checkpoint (any ZeRO stage, any world size) -> a checkpoint directory of
    this framework holding its exact fp32 weights (DeepSpeed's zero_to_fp32; optimizer state is
    not carried over, so a run started from it begins a fresh optimizer)."""
    try:
        deepspeed_package()
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    except ImportError as err:
        raise ConfigError("importing a DeepSpeed checkpoint needs deepspeed: pip install 'framework[deepspeed]'") from err
    if not ds_dir.is_dir():
        raise CheckpointError(f"{ds_dir} is not a DeepSpeed checkpoint directory.")
    try:
        state = get_fp32_state_dict_from_zero_checkpoint(str(ds_dir), tag=tag)
    except (FileNotFoundError, ValueError, KeyError) as err:
        raise CheckpointError(f"{ds_dir} is not a readable DeepSpeed checkpoint ({err}).") from err
    return write_weights_checkpoint(state, out, {"strategy": "imported",
                                                 "source": {"deepspeed_checkpoint": str(ds_dir), "tag": tag}})
