"""The model and tokenizer `framework generate` (and `framework predict`) run: from a run's best
checkpoint, one checkpoint directory, or a Hugging Face `from_pretrained` directory; built in one
process on one device, in float32 unless asked otherwise."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from framework.checkpoint.convert import read_model_state
from framework.checkpoint.format import read_meta
from framework.checkpoint.load import find_checkpoint
from framework.checkpoint.rng import seed_everything
from framework.checkpoint.weights import fit_saved_state, load_error_summary
from framework.config.build import build
from framework.config.resolvers import BYTES, tokenizer_file
from framework.construction.named_state import strict_load
from framework.data.tokenizer import Tokenizer
from framework.errors import CheckpointError, ConfigError
from framework.generation.decode import vocabulary_size
from framework.models.build import build_model
from framework.models.context import context_length

HUB_CONFIG = "config.json"


@dataclass
class Loaded:
    model: torch.nn.Module
    tokenizer: Tokenizer
    source: str
    """What was loaded, said in one line (the checkpoint and why it was chosen, or the directory)."""
    config: dict | None = None
    """The run's config (None for a Hugging Face directory)."""


def is_hub_directory(target: Path) -> bool:
    return (target / HUB_CONFIG).is_file() and not (target / "config.yaml").is_file()


def run_config(checkpoint: Path, run_dir: Path | None) -> dict:
    if run_dir is not None:
        return OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"), resolve=True)
    config = read_meta(checkpoint).get("config")
    if not config:
        raise CheckpointError(f"{checkpoint}: its meta.json records no config and it is not inside a run directory; "
                              "give the run directory that holds it.")
    return config


def load_model(target: Path, command: str, tokenizer: str | None = None, device: str = "cpu",
               dtype: torch.dtype = torch.float32) -> Loaded:
    """The model with the checkpoint's weights (or a Hugging Face directory's), in eval mode on
    `device`, and its tokenizer: `tokenizer` if given, else the run's data.tokenizer (bytes for
    the byte-level data), else the Hugging Face directory's own tokenizer.json."""
    if is_hub_directory(target):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(target, local_files_only=True, dtype=dtype)
        spec = tokenizer or (str(target) if (target / "tokenizer.json").is_file() else None)
        if spec is None:
            raise ConfigError(f"{command} {target}: the directory has no tokenizer.json; give --tokenizer (a "
                              "tokenizer.json, a directory holding one, or bytes).")
        loaded = Loaded(model, _tokenizer(spec, command), f"{target} (Hugging Face directory)")
    else:
        checkpoint, run_dir, why = find_checkpoint(target, command)
        config = run_config(checkpoint, run_dir)
        model = rebuild(checkpoint, config)
        spec = tokenizer or (config.get("data") or {}).get("tokenizer") or BYTES
        quantized = quantizing_precision(config)
        how = f"; its {quantized.name} layers as it trained" if quantized is not None else ""
        loaded = Loaded(model, _tokenizer(spec, command), f"{checkpoint} ({why}{how})", config)
        if quantized is not None:  # a cast would not touch the quantized layers; the rest stays as built
            dtype = None
    loaded.model.to(device=device, dtype=dtype).eval()
    check_vocabulary(loaded, command)
    return loaded


def quantizing_precision(config: dict):
    """The run's precision where it quantizes layers as it builds them (precision=bnb_*), else None."""
    node = config.get("precision")
    if not node:
        return None
    precision = build(OmegaConf.create(node), "precision")
    return precision if getattr(precision, "quantizes_while_building", False) else None


def rebuild(checkpoint: Path, config: dict, adapter: bool = True, quantized: bool = True) -> torch.nn.Module:
    """The model of a run's config with the checkpoint's weights, on the CPU, as it trained: a
    quantized run's chosen layers quantized (QLoRA's 4-bit base; `quantized=False`: the float base
    its layers were quantized from), the rest in float32. An adapter run's model is rebuilt adapted
    (`adapter=False`: its base alone, before any weight is loaded), its frozen weights from the
    config (the pretrained weights, or the run's seeded initialisation)."""
    seed_everything(config.get("seed", 0))
    model = build_model(OmegaConf.create(config["model"]))
    precision = quantizing_precision(config) if quantized else None
    if precision is not None:
        precision.setup("cpu")
        model = precision.convert_module(model)
    if config.get("adapter") and not adapter:
        return model
    if config.get("adapter"):
        model = build(OmegaConf.create(config["adapter"]), "adapter").apply(model)
    _, state = read_model_state(checkpoint)
    try:
        state = fit_saved_state(model, state)
        model.load_state_dict(state, strict=strict_load(model, state))
    except (RuntimeError, KeyError, ValueError) as err:
        raise CheckpointError(f"{checkpoint} does not fit the model of its own config ({load_error_summary(err)}).") \
            from err
    return model


def _tokenizer(spec: str, command: str) -> Tokenizer:
    if spec != BYTES:
        tokenizer_file(spec)  # a missing file is named before the tokenizers library reads it
    return Tokenizer(spec)


def check_vocabulary(loaded: Loaded, command: str) -> None:
    """A tokenizer whose ids the model has no embedding for cannot drive it."""
    model_vocab = vocabulary_size(loaded.model)
    if model_vocab is not None and loaded.tokenizer.vocab_size > model_vocab:
        raise ConfigError(f"{command}: the tokenizer ({loaded.tokenizer.spec}) has {loaded.tokenizer.vocab_size} "
                          f"tokens, the model's vocabulary {model_vocab}: they do not belong together. Give the "
                          "tokenizer the model was trained with (--tokenizer).")


def check_prompt(loaded: Loaded, ids: list[int], text: str, command: str) -> None:
    context = context_length(loaded.model)
    if not ids:
        raise ConfigError(f"{command}: the prompt {text!r} has no token; give some text to continue.")
    if context is not None and len(ids) > context:
        raise ConfigError(f"{command}: the prompt is {len(ids)} tokens, longer than the model's context of {context}; "
                          "shorten it (its last tokens are what the model would see).")
