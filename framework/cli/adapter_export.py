"""Exports of an adapter run's checkpoint (it holds the adapters' weights alone): the adapters as a
peft directory that `peft.PeftModel.from_pretrained(base_model, DIR)` loads onto the base model,
or the model with the adapters merged into its weights (`--to hf`, `torch`, `safetensors`)."""
from __future__ import annotations

import warnings
from pathlib import Path

from omegaconf import OmegaConf

from framework.adapter.lora import base_name, fan_in_fan_out, peft_package
from framework.checkpoint.convert import read_model_state, write_weights_checkpoint
from framework.checkpoint.format import read_meta
from framework.cli.hub_tokenizer import export_tokenizer, run_tokenizer
from framework.config.build import build
from framework.errors import ConfigError
from framework.generation.load import rebuild
from framework.models.hf_causal_lm import is_hub_model


def adapter_config(meta: dict) -> dict | None:
    """The run's `adapter` config, if the checkpoint is an adapter run's."""
    return (meta.get("config") or {}).get("adapter") or None


def merged_state(checkpoint: Path) -> tuple[dict, dict]:
    """(meta.json, the state of the model with the adapters merged into its weights), under the
    names of the model without adapters: what the adapted model computes, as a plain model."""
    peft_package()
    from peft.tuners.lora import LoraLayer

    meta = read_meta(checkpoint)
    model = rebuild(checkpoint, meta["config"], quantized=False)  # merged into the float weights (said by convert)
    for module in model.modules():
        if isinstance(module, LoraLayer):
            module.merge()
    state = {base_name(name): value for name, value in model.state_dict().items()
             if "lora_" not in name and "modules_to_save" not in name}
    return meta, state


def write_peft_directory(checkpoint: Path, out: Path) -> Path:
    """adapter_config.json and adapter_model.safetensors, written by peft itself from the base
    model of the run's config with the checkpoint's adapters."""
    peft = peft_package()
    LoraConfig, get_peft_model = peft.LoraConfig, peft.get_peft_model
    meta = read_meta(checkpoint)
    config = meta.get("config") or {}
    if not adapter_config(meta):
        raise ConfigError(f"--to peft: {checkpoint} is not an adapter run's checkpoint (its config has no adapter); "
                          "export its weights with --to safetensors or --to hf.")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--to peft: {out} exists and is not empty; give a new directory.")
    adapted = rebuild(checkpoint, config, quantized=False)
    base = rebuild(checkpoint, config, adapter=False, quantized=False)
    lora = build(OmegaConf.create(config["adapter"]), "adapter")
    targets = lora.targets(base)
    with warnings.catch_warnings():  # peft asks transformers 5 a deprecated question about checkpointing
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        peft_model = get_peft_model(base, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                     target_modules=targets, use_dora=lora.use_dora,
                                                     modules_to_save=lora.modules_to_save or None,
                                                     fan_in_fan_out=fan_in_fan_out(base, targets)))
    trained = {name: value for name, value in adapted.state_dict().items() if "lora_" in name}
    missing = peft_model.base_model.model.load_state_dict(trained, strict=False)
    if missing.unexpected_keys:
        raise ConfigError(f"--to peft: the adapters of {checkpoint} do not fit peft's model of the same config "
                          f"({missing.unexpected_keys[0]} ...).")
    hub = is_hub_model(config.get("model") or {})
    settings = peft_model.peft_config["default"]
    if hub:  # a transformers causal LM: peft's AutoPeftModelForCausalLM and generate take it as one
        settings.task_type = "CAUSAL_LM"
    pretrained = (config.get("model") or {}).get("pretrained")
    if pretrained:  # where the base is, from any directory: recorded absolute, or a hub name as given
        settings.base_model_name_or_path = str(pretrained)
    peft_model.save_pretrained(str(out))
    tokenizer, template = run_tokenizer(config)
    export_tokenizer(tokenizer, out, chat_template=template)
    return out


def write_merged_run(checkpoint: Path, out: Path) -> Path:
    """An adapter run's model with its adapters merged, as a run directory of this framework
    (config.yaml: the run's, without the adapter; checkpoints/step_N: the merged weights alone),
    which task.teacher, task.reference, ckpt_path and every command after training take as a plain
    model. A run without adapters is written the same way (its weights as they are)."""
    meta = read_meta(checkpoint)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--to run: {out} exists and is not empty; give a new directory.")
    config = dict(meta.get("config") or {})
    if adapter_config(meta):
        _, state = merged_state(checkpoint)
    else:
        _, state = read_model_state(checkpoint)
    config["adapter"] = None
    step = int(meta.get("step") or 0)
    out.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(config), out / "config.yaml")
    write_weights_checkpoint(state, out / "checkpoints" / f"step_{step:06d}",
                             {"step": step, "epoch": meta.get("epoch", 0), "config": config,
                              "source": {"merged_from": str(checkpoint)}})
    return out
