"""Hugging Face causal language models (`transformers`), from a config in YAML, a local config
directory or a local pretrained directory. Never a download: the run happens offline, and a hub
name that is not already on disk is refused with the command that fetches it.

`transformers` is imported only when this model is chosen (it costs seconds of start-up).

Under a sharding strategy the model is built without weights first (the meta device, or
DeepSpeed's partitioned init) and every rank keeps only its shards:
- random init: Hugging Face skips its weight initialisation on the meta device; it is called here
  instead, so the meta build records it and each rank's shards get the values an ordinary build
  with the same seed makes (framework/construction/meta_init.py);
- pretrained: the model is built from the directory's config, and its weight files are named in
  `model.pretrained_weights`; the trainer loads them after sharding, each rank copying only its
  own part of the mapped files (framework/checkpoint/weights.py).
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import json
import os
import sys
from importlib.util import find_spec
from pathlib import Path

import torch
from torch import nn

from framework.checkpoint.storage import readable_by_others, stored_once
from framework.construction.meta_build import in_sharded_build
from framework.errors import ConfigError, did_you_mean
from framework.models.hf_routers import watch_routers
from framework.models.hf_stages import add_pipeline_stages

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Attention implementations that need a package of their own (transformers imports it when the
# model is built): checked first, so the message names the key instead of a constructor's error.
ATTENTION_PACKAGES = {"flash_attention_2": ("flash_attn", "pip install flash-attn (CUDA only)"),
                      "flash_attention_3": ("flash_attn_interface", "install FlashAttention 3 (Hopper GPUs)"),
                      "kernels": ("kernels", "pip install kernels")}
LIST_MODEL_TYPES = "python -c \"import transformers; print(sorted(transformers.CONFIG_MAPPING))\""


def _transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the hub from a training run
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        import transformers
    except ImportError as err:
        raise ConfigError("model: a Hugging Face model needs transformers: pip install 'framework[hf]'") from err
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # "Loading weights" bars on every from_pretrained
    return transformers


def local_directory(name: str, key: str) -> Path:
    """A local directory for `name`: a path, or a hub name already in the Hugging Face cache.
    Anything else is refused: a training run never downloads."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"{key}={name!r}: the directory has no config.json (not a Hugging Face model "
                              "directory; save one with model.save_pretrained(DIR)).")
        return path
    if path.exists():
        raise ConfigError(f"{key}={name!r} is a file; give the directory that holds config.json.")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # not in the cache, an invalid repo id, no huggingface_hub: all "not on disk"
        pass
    raise ConfigError(f"{key}={name!r}: no such directory, and not in the Hugging Face cache. The framework never "
                      f"downloads during a run: fetch it first (`hf download {name}`, or save_pretrained to a "
                      "directory) and give the directory.")


def hf_config(config: dict | None = None, config_dir: str | None = None, pretrained: str | None = None):
    """The model's `transformers` config object, from the same arguments as `causal_lm` (also used
    by `framework convert --to hf`, without building the model)."""
    transformers = _transformers()
    fields = dict(config or {})
    sources = [k for k, v in (("model.config_dir", config_dir), ("model.pretrained", pretrained)) if v]
    if len(sources) > 1:
        raise ConfigError(f"{' and '.join(sources)} are both set: give one (model.config may still override fields).")
    if sources:
        directory = local_directory(config_dir or pretrained, sources[0])
        loaded = transformers.AutoConfig.from_pretrained(directory, local_files_only=True)
        named_type = fields.pop("model_type", None)
        if named_type is not None and named_type != loaded.model_type:
            raise ConfigError(f"{sources[0]}={config_dir or pretrained}: its config.json is a {loaded.model_type}, but "
                              f"model.config.model_type={named_type!r} (model/config={named_type}'s fields, or the "
                              "recipe's). The directory's config.json is the architecture: set model.config=null, or "
                              f"choose model/config={loaded.model_type} to override some of its fields.")
        check_fields(type(loaded), fields)
        fields = as_declared(type(loaded), fields)
        own = copy.deepcopy(loaded) if pretrained else None
        for key, value in fields.items():
            setattr(loaded, key, value)
        if own is not None:
            check_weights_fit(own, loaded, fields, pretrained)
        check_heads(loaded)
        check_experts(loaded)
        return loaded
    model_type = fields.pop("model_type", None)
    if not model_type:
        raise ConfigError("model.config.model_type is missing: name the architecture (e.g. gpt2, llama, "
                          "qwen2), or give model.config_dir / model.pretrained.")
    known = transformers.CONFIG_MAPPING
    if model_type not in known:
        close = did_you_mean(model_type, list(known.keys()), cutoff=0.6)
        raise ConfigError(f"model.config.model_type={model_type!r} is not an architecture transformers "
                          f"{transformers.__version__} knows.{close} List them: {LIST_MODEL_TYPES}")
    check_fields(known[model_type], fields)
    from huggingface_hub.errors import StrictDataclassError  # transformers' own dependency

    try:
        cfg = transformers.AutoConfig.for_model(model_type, **as_declared(known[model_type], fields))
    except (ValueError, StrictDataclassError) as err:
        raise ConfigError(f"model.config (model_type={model_type}): {str(err).splitlines()[0]}") from err
    check_heads(cfg)
    check_experts(cfg)
    return cfg


def _weight_shapes(config) -> dict[str, tuple]:
    """Each weight's name and shape for `config`'s model, built on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = _transformers().AutoModelForCausalLM.from_config(config)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def check_weights_fit(own, merged, fields: dict, pretrained: str) -> None:
    """model.config's fields on a pretrained directory may change how the model behaves (dropout,
    attention), never its weights' shapes: a recipe's sizes for a model built from scratch (or the
    family group's defaults) would silently replace the directory's own architecture. Refused,
    naming the fields, both values and the fix."""
    changed = {key: value for key, value in fields.items() if getattr(own, key, None) != value}
    if not changed or _weight_shapes(own) == _weight_shapes(merged):
        return
    said = ", ".join(f"model.config.{key}={value!r} (its config.json: {getattr(own, key, None)!r})"
                     for key, value in changed.items())
    raise ConfigError(f"model.pretrained={pretrained}: model.config replaces fields of the directory's config.json "
                      f"({said}), which changes the shapes of its weights, so they would not be its model. Its "
                      "config.json is the architecture: set model.config=null (a "
                      "recipe's or the family group's sizes are for a model built from scratch), or keep in "
                      "model.config only fields that leave the weights as they are (dropout, attention).")


def check_fields(config_class, fields: dict) -> None:
    """Fields the architecture's config does not define are refused: transformers would keep them
    as loose attributes (and write them to config.json) while the model ignores them, which is
    how a typo, or GPT-2's fields merged under `model_type: llama`, would pass in silence."""
    own = _named_fields(config_class) - _named_fields(_transformers().PretrainedConfig)
    if not own:
        return  # a config class that names no fields of its own: nothing to compare with
    accepted = _named_fields(config_class) | set(getattr(config_class, "attribute_map", {}) or {})
    unknown = sorted(k for k in fields if k not in accepted)
    if not unknown:
        return
    model_type = getattr(config_class, "model_type", config_class.__name__)
    hints = {k: did_you_mean(k, accepted, cutoff=0.7) for k in unknown}
    said = "".join(hint.replace(" Did you mean", f" For {k}: did you mean") for k, hint in hints.items())
    if not all(hints.values()):  # not only typos: fields of another architecture, merged in
        said += (f" Fields merged from another architecture? Choose the family with model/config={model_type} "
                 "(it replaces the fields instead of merging them; conf/model/config/ lists the families), or "
                 "write model.config whole.")
    raise ConfigError(f"model.config: {model_type} has no field {', '.join(unknown)}.{said} {model_type}'s fields: "
                      f"{', '.join(sorted(own))}.")


def as_declared(config_class, fields: dict) -> dict:
    """`fields` with a whole number given for a float field as that float: YAML and the command line
    read `router_aux_loss_coef=0` as an int, which transformers' strict configs refuse."""
    declared = {f.name: f.type for f in dataclasses.fields(config_class)} if dataclasses.is_dataclass(config_class) else {}

    def floating(kind) -> bool:
        return kind is float or (isinstance(kind, str) and kind.replace(" ", "") in ("float", "float|None")) or (
            float in getattr(kind, "__args__", ()))

    return {key: float(value) if type(value) is int and floating(declared.get(key)) else value
            for key, value in fields.items()}


def _named_fields(config_class) -> set[str]:
    """The keyword parameters a config class's constructor names (not **kwargs)."""
    return {name for name, p in inspect.signature(config_class.__init__).parameters.items()
            if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def check_heads(cfg) -> None:
    """Head counts that do not divide (attention would fail at its first reshape, blamed on the
    data): hidden size by attention heads, attention heads by key/value heads."""
    names = {"hidden": _field_name(cfg, ("hidden_size", "n_embd", "d_model")),
             "heads": _field_name(cfg, ("num_attention_heads", "n_head"))}
    hidden = getattr(cfg, names["hidden"], None) if names["hidden"] else None
    heads = getattr(cfg, names["heads"], None) if names["heads"] else None
    kv = getattr(cfg, "num_key_value_heads", None)
    if isinstance(hidden, int) and isinstance(heads, int) and heads and hidden % heads \
            and getattr(cfg, "head_dim", None) is None:
        raise ConfigError(f"model.config.{names['hidden']}={hidden} is not divisible by model.config.{names['heads']}"
                          f"={heads}: each head takes an equal share of the hidden size; choose {names['heads']} "
                          f"among {_divisors(hidden)}.")
    if isinstance(kv, int) and isinstance(heads, int) and kv and heads % kv:
        raise ConfigError(f"model.config.num_key_value_heads={kv} does not divide model.config.{names['heads']}="
                          f"{heads}: key/value heads are shared by equal groups of attention heads; choose "
                          f"num_key_value_heads among {_divisors(heads)}.")


def check_experts(cfg) -> None:
    """A mixture of experts' routing fields, checked as the built-in GPT's model.moe is (top_k,
    balance_coef): more experts per token than experts would fail in the router's first top-k, blamed
    on the data, and a negative auxiliary-loss weight would reward imbalance and train on."""
    experts_name = _field_name(cfg, ("num_local_experts", "num_experts"))
    experts = getattr(cfg, experts_name, None) if experts_name else None
    per_token = getattr(cfg, "num_experts_per_tok", None)
    coef = getattr(cfg, "router_aux_loss_coef", None)
    if not isinstance(per_token, int) or not isinstance(experts, int):
        return  # not a mixture of experts (or a family that names its fields otherwise)
    if experts < 1:
        raise ConfigError(f"model.config.{experts_name}={experts}: a mixture of experts needs at least one expert "
                          f"per layer; choose {experts_name} >= 1.")
    if not 1 <= per_token <= experts:
        bound = f"more than model.config.{experts_name}={experts}" if per_token > experts else "less than 1"
        raise ConfigError(f"model.config.num_experts_per_tok={per_token} is {bound}: each token is sent to "
                          f"num_experts_per_tok of the layer's {experts} experts; choose num_experts_per_tok between 1 "
                          f"and {experts}.")
    if isinstance(coef, (int, float)) and coef < 0:
        raise ConfigError(f"model.config.router_aux_loss_coef={coef}: the balancing loss's weight must be 0 (none) "
                          "or more; a negative weight rewards routing every token to the same experts. Choose "
                          "router_aux_loss_coef >= 0.")


def _field_name(cfg, candidates: tuple[str, ...]) -> str | None:
    """The name the architecture's own config uses for one of `candidates` (GPT-2: n_embd, not the
    hidden_size alias), so a message names the key the user wrote."""
    own = _named_fields(type(cfg))
    return next((k for k in candidates if k in own), None) or next((k for k in candidates if hasattr(cfg, k)), None)


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def check_attention(attn_implementation: str | None) -> None:
    """An attention implementation whose package is not installed, refused by its key."""
    needed = ATTENTION_PACKAGES.get(attn_implementation or "")
    if needed and find_spec(needed[0]) is None:
        raise ConfigError(f"model.attn_implementation={attn_implementation}: needs the {needed[0]} package, which "
                          f"is not installed here ({needed[1]}); use model.attn_implementation=sdpa (or eager).")


def weight_files(directory: Path) -> list[Path]:
    """The weight files of a pretrained directory (every shard of a sharded one)."""
    for name in WEIGHT_FILES:
        path = directory / name
        if not path.is_file():
            continue
        if name.endswith(".index.json"):
            shards = sorted(set(json.loads(path.read_text())["weight_map"].values()))
            return [directory / s for s in shards]
        return [path]
    raise ConfigError(f"model.pretrained={str(directory)!r}: no weights there (looked for {', '.join(WEIGHT_FILES)}).")


def causal_lm(config: dict | None = None, config_dir: str | None = None, pretrained: str | None = None,
              dtype: str | None = None, attn_implementation: str | None = "sdpa",
              gradient_checkpointing: bool = False) -> nn.Module:
    """A `transformers` causal LM (AutoModelForCausalLM).

    config: the model's config fields, e.g. {model_type: gpt2, n_layer: 4} (random init); with
    config_dir or pretrained, fields that override the directory's config.
    config_dir: a local directory holding config.json: that architecture, random init.
    pretrained: a local directory (config.json plus weights), or a hub name already in the
    Hugging Face cache: its weights.
    dtype: the parameters' dtype (float32, bfloat16, float16; null: float32). Mixed precision is
    the `precision` group's job; this is for models kept in a lower precision.
    attn_implementation: eager, sdpa (default) or another `transformers` supports.
    gradient_checkpointing: the model's own activation checkpointing (the strategies' own is
    `strategy.activation_checkpointing`).
    """
    transformers = _transformers()
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError(f"model.dtype={dtype!r}: choose one of {', '.join(DTYPES)} or null.")
    torch_dtype = DTYPES.get(dtype or "float32")
    if config_dir and pretrained:
        raise ConfigError("model.config_dir and model.pretrained are both set: give one (model.config may still "
                          "override fields).")
    directory = local_directory(pretrained, "model.pretrained") if pretrained else None  # looked up once
    check_attention(attn_implementation)
    cfg = hf_config(config, config_dir, str(directory) if directory else None)
    if attn_implementation:
        cfg._attn_implementation = attn_implementation
    auto = transformers.AutoModelForCausalLM
    if directory and not in_sharded_build():
        model = auto.from_pretrained(directory, config=cfg, dtype=torch_dtype, local_files_only=True)
    else:
        model = _from_config(auto, cfg, torch_dtype, initialise=not directory)
        if directory:  # loaded into the shards after sharding (see the module docstring)
            model.pretrained_weights = [str(p) for p in weight_files(directory)]
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return for_training(model)


def for_training(model: nn.Module) -> nn.Module:
    """No key/value cache in training forwards: nothing reuses it, and transformers keeps packed
    rows' sequences apart (by their position_ids) only without one. Generation asks for a cache
    itself (framework/generation/decode.py). Its layers named for strategy=pipeline
    (framework/models/hf_stages.py); a mixture of experts' routers watched for its balancing loss
    (framework/models/hf_routers.py)."""
    if getattr(model, "config", None) is not None and hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    return watch_routers(add_pipeline_stages(model))


def from_pretrained(model_class: str, pretrained_model_name_or_path: str, **kwargs) -> nn.Module:
    """What a recipe's `_target_: transformers.<Class>.from_pretrained` runs (framework/config/build.py
    routes it here): the same call, offline, from a local directory (or the local cache); in a
    sharded build the structure from its config.json, its weight files named for the trainer."""
    transformers = _transformers()
    cls = getattr(transformers, model_class.rsplit(".", 1)[-1], None)
    if cls is None:
        raise ConfigError(f"model._target_={model_class}.from_pretrained: transformers has no {model_class}.")
    directory = local_directory(pretrained_model_name_or_path, "model.pretrained_model_name_or_path")
    if not in_sharded_build():
        return for_training(cls.from_pretrained(directory, local_files_only=True, **kwargs))
    config = kwargs.pop("config", None) or transformers.AutoConfig.from_pretrained(directory, local_files_only=True)
    build = getattr(cls, "from_config", None) or cls._from_config
    model = build(config, **{k: v for k, v in kwargs.items() if k in ("dtype", "attn_implementation")})
    model.pretrained_weights = [str(p) for p in weight_files(directory)]
    return for_training(model)


def _from_config(auto, cfg, dtype: torch.dtype, initialise: bool) -> nn.Module:
    context = contextlib.nullcontext()
    if initialise and torch.empty(0).device.type == "meta":
        context = _initialise_on_meta()
    elif initialise and _in_deepspeed_partitioned_init():
        context = _initialise_gathered()
    with context:
        return auto.from_config(cfg, dtype=dtype)


def _in_deepspeed_partitioned_init() -> bool:
    zero = sys.modules.get("deepspeed.runtime.zero.partition_parameters")
    return getattr(zero, "top_level_context", None) is not None


@contextlib.contextmanager
def _initialise_on_meta():
    """transformers skips its weight initialisation on the meta device (there is no data to
    write). Here it must run, in the same order as in an ordinary build (a nested model initialises
    when its own constructor ends), so that the meta build records every initialiser and each
    rank's shards get an ordinary build's values: its device check is told "no device"."""
    from transformers import modeling_utils

    original = modeling_utils.get_torch_context_manager_or_global_device
    modeling_utils.get_torch_context_manager_or_global_device = lambda: None
    try:
        yield
    finally:
        modeling_utils.get_torch_context_manager_or_global_device = original


@contextlib.contextmanager
def _initialise_gathered():
    """Inside DeepSpeed's partitioned init a module's parameters are already partitioned (empty)
    when transformers initialises them, at the end of each (nested) model's constructor: there
    its ZeRO-3 variant runs instead, which gathers each module's parameters first, so the values
    are an ordinary build's, made at the same point."""
    from transformers import modeling_utils
    from transformers.integrations.deepspeed import initialize_weights_zero3

    original = modeling_utils.PreTrainedModel.initialize_weights
    modeling_utils.PreTrainedModel.initialize_weights = initialize_weights_zero3
    try:
        yield
    finally:
        modeling_utils.PreTrainedModel.initialize_weights = original


def save_for_hub(state: dict[str, torch.Tensor], model_node: dict, out: Path) -> Path:
    """Write a directory that `AutoModelForCausalLM.from_pretrained(out)` loads: config.json and
    model.safetensors (tied weights stored once, as transformers writes them), from a framework
    checkpoint's model state and its recorded `model` config."""
    from safetensors.torch import save_file

    args = {k: v for k, v in model_node.items() if k in ("config", "config_dir", "pretrained")}
    cfg = hf_config(**args)
    if model_node.get("dtype"):
        cfg.dtype = model_node["dtype"]
    cfg.architectures = [_model_class(cfg).__name__]
    for special in ("bos_token_id", "eos_token_id", "pad_token_id"):
        # a family's default ids (GPT-2's 50256) outside a smaller vocabulary (the byte-level 256):
        # no such token exists, and transformers warns about it on every load
        if isinstance(getattr(cfg, special, None), int) and getattr(cfg, special) >= cfg.vocab_size:
            setattr(cfg, special, None)
    if getattr(cfg, "tie_word_embeddings", False):  # a checkpoint read from shards shares no memory
        state = {name: tensor for name, tensor in state.items() if not name.endswith("lm_head.weight")}
    unique, _ = stored_once(state)
    out.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(out)
    save_file(unique, str(out / "model.safetensors"), metadata={"format": "pt"})
    readable_by_others(out / "model.safetensors")
    return out


def _model_class(cfg):
    transformers = _transformers()
    try:
        return transformers.AutoModelForCausalLM._model_mapping[type(cfg)]
    except KeyError as err:
        raise ConfigError(f"model: transformers has no causal LM for model_type={cfg.model_type!r}.") from err


def is_hub_model(model_node: dict) -> bool:
    """Whether a recorded `model` config builds a Hugging Face model (this module)."""
    return str(model_node.get("_target_", "")).startswith(__name__ + ".")
