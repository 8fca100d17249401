"""A frozen second model beside the trained one (a preference task's reference, a distillation's
teacher): where it comes from, checked before launch, and built in each worker by the strategy
(`place_frozen`: in the compute precision, laid out as the trained model is, no gradients, never
in the optimizer or a checkpoint).

Its source is one of:
- the trained model's own initial weights (`path` null): rebuilt from the same config and the same
  random state as the trained model was built from, so a resumed run rebuilds the same reference;
  with an adapter (adapter=lora) no second model at all: the trained model with its adapters off;
- a run directory of this framework (its best checkpoint, else its newest), built from that run's
  own model config, or a checkpoint directory (this run's model config): its weights loaded;
- a local Hugging Face model directory (config.json and weights): its own architecture and weights.
Its vocabulary and tokenizer must be the trained model's and the data's (checked before launch).
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from framework.checkpoint.load import find_checkpoint, load_model_weights
from framework.checkpoint.rng import rng_state, set_rng_state
from framework.checkpoint.weights import initial_weights
from framework.config.resolvers import BYTES
from framework.construction.meta_build import meta_device
from framework.data.tokenizer import loaded_tokenizer
from framework.errors import ConfigError
from framework.models.build import build_model
from framework.tasks.second_model import Frozen, FrozenSource

HUB_MODEL = "framework.models.hf_causal_lm.causal_lm"  # a Hugging Face directory's model, beside a model of another kind


def inspect_frozen(source: FrozenSource | None, cfg, data, model) -> tuple[list[str], int]:
    """Before launch (`model`: the trained model, on the meta device): (what is wrong with the
    source, the frozen model's parameters). The directory exists and is one of the kinds; its model
    builds (once, on the meta device), with the trained model's vocabulary, from a tokenizer that
    gives the data's ids; an adapter that trains whole modules cannot stand for the initial weights
    with its adapters off. No parameters where there is no second model (none asked for, or the
    trained model with its adapters off stands for it)."""
    if source is None:
        return [], 0
    adapter = cfg.get("adapter")
    if source.kind == "initial":
        kept = list((adapter or {}).get("modules_to_save") or [])
        if adapter and source.adapters_may_stand_in and kept:
            return [f"{source.key}=null with adapter.modules_to_save={kept}: the reference would be the trained model "
                    "with its adapters off, but those modules train whole and do not go back; give the reference as a "
                    f"directory ({source.key}=<a run or Hugging Face directory>), or adapter.modules_to_save=[]."], 0
        if source.adapters_stand_in(adapter):
            return [], 0
        return [], sum(p.numel() for name, p in model.named_parameters() if "lora_" not in name)
    path = Path(source.path).expanduser()
    if not path.is_dir():
        return [f"{source.key}={source.path}: no such directory; give a run directory of this framework "
                "(outputs/<name>), a checkpoint directory, or a local Hugging Face model directory (with "
                "config.json)."], 0
    try:
        run = _located(source)[1] if source.kind == "run" else None
        node = frozen_node(source, cfg, run)
        with meta_device():
            frozen = build_model(node)
    except ConfigError as err:
        return [f"{source.key}={source.path}: {err}"], 0
    except Exception as err:  # a directory transformers cannot read
        return [f"{source.key}={source.path}: its model cannot be built ({type(err).__name__}: {err})."], 0
    theirs, ours = vocabulary(frozen), vocabulary(model)
    if theirs and ours and theirs != ours:
        return [f"{source.key}={source.path}: its model scores {theirs:,} token ids, the trained model {ours:,}: the "
                "two must share one tokenizer; give a model of the same vocabulary."], 0
    spec = _own_tokenizer(source, run)
    if spec is not None and loaded_tokenizer(spec).sha256() != data.tokenizer.sha256():
        return [f"{source.key}={source.path}: its tokenizer ({spec}) turns text into other ids than data.tokenizer "
                f"({data.tokenizer.spec}); the two models must read the same ids: give data.tokenizer={spec}, or a "
                "model trained with the data's tokenizer."], 0
    return [], sum(p.numel() for p in frozen.parameters())


def vocabulary(model) -> int | None:
    """The token ids a model scores (its config's vocab_size, or the built-in GPT's), None if unknown."""
    config = getattr(model, "config", None)
    return getattr(config, "vocab_size", None) or getattr(model, "vocab_size", None)


def _located(source: FrozenSource) -> tuple[Path, DictConfig | None]:
    """A run or checkpoint directory's checkpoint (the best, else the newest) and its run's config
    (None: a checkpoint directory outside a run), looked up once by each caller."""
    checkpoint, run, _ = find_checkpoint(Path(source.path).expanduser(), source.key)
    return checkpoint, OmegaConf.load(run / "config.yaml") if run is not None else None


def _own_tokenizer(source: FrozenSource, run: DictConfig | None) -> str | None:
    """The tokenizer the source's model reads (its directory's, or the run's data.tokenizer), where known."""
    path = Path(source.path).expanduser()
    if source.kind == "hub":
        return str(path) if (path / "tokenizer.json").is_file() else None
    spec = run.data.get("tokenizer") if run is not None and "data" in run else None
    if spec is None or (spec != BYTES and not Path(str(spec)).expanduser().exists()):
        return None
    return str(spec)


def frozen_node(source: FrozenSource, cfg, run: DictConfig | None = None):
    """The model config the frozen model is built from: the trained model's (initial weights); a
    Hugging Face directory's own (this run's Hugging Face settings, its architecture the directory's);
    a run's own model config (`run`: that run's config; None, a checkpoint directory outside a run:
    this run's)."""
    if source.kind == "initial":
        return cfg.model
    path = str(Path(source.path).expanduser())
    if source.kind == "hub":
        base = cfg.model if "pretrained" in cfg.model else OmegaConf.create({"_target_": HUB_MODEL})
        return OmegaConf.merge(base, {"pretrained": path, "config": None, "config_dir": None})
    if run is None:
        return cfg.model
    if run.get("adapter"):
        raise ConfigError(f"the run trained {run.adapter._target_.rsplit('.', 1)[-1]} adapters, and its checkpoints "
                          f"hold them alone; merge them into a plain model first (framework convert {path} merged "
                          "--to run) and give that directory.")
    return run.model


def handed_over(source: FrozenSource, adapter, build) -> Frozen:
    """What the task is given: the trained model with its adapters off where they stand in (nothing
    built), else the model `build()` places."""
    return Frozen(source.key, None if source.adapters_stand_in(adapter) else build())


def build_frozen(source: FrozenSource, cfg, strategy, built_from: dict):
    """In each worker: the frozen model placed by `strategy` (`built_from`: the random state the
    trained model was built from). The random state the run goes on with is left as it was."""
    after = rng_state()
    checkpoint, run = _located(source) if source.kind == "run" else (None, None)
    node = frozen_node(source, cfg, run)
    if source.kind == "initial":
        set_rng_state(built_from)
    try:
        model = strategy.place_frozen(lambda: build_model(node))
    finally:
        set_rng_state(after)
    weights = getattr(strategy.unwrap(model), "pretrained_weights", None)
    if weights:  # a sharded build names its weights and each rank copies its part
        strategy.load_model_state_dict(model, initial_weights(strategy.unwrap(model), weights))
    if checkpoint is not None:
        load_model_weights(strategy, model, checkpoint)
    return model
