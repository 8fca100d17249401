"""A frozen second model beside the trained one (a preference task's reference, a distillation's
teacher): where it comes from, checked before launch, and built in each worker by the strategy
(`place_frozen`: in the compute precision, laid out as the trained model is, no gradients, never
in the optimizer or a checkpoint).

Its source is one of:
- the trained model's own initial weights (`path` null): rebuilt from the same config and the same
  random state as the trained model was built from, so a resumed run rebuilds the same reference;
  with an adapter (adapter=lora) no second model at all: the trained model with its adapters off;
- a run directory of this framework (its best checkpoint, else its newest) or a checkpoint directory:
  its weights loaded into this run's model (the same architecture);
- a local Hugging Face model directory (config.json and weights): this run's Hugging Face model
  config with `pretrained` set to it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from framework.checkpoint.load import find_checkpoint, load_model_weights
from framework.checkpoint.rng import rng_state, set_rng_state
from framework.checkpoint.weights import initial_weights
from framework.data.tokenizer import tokenizer_mismatch
from framework.errors import ConfigError
from framework.models.build import build_model

HUB_CONFIG = "config.json"


@dataclass(frozen=True)
class FrozenSource:
    """Where a task's frozen model comes from: `key` names it in messages (task.reference); `path`
    None: the trained model's initial weights, else a run, checkpoint or Hugging Face directory;
    `adapters_off`: with an adapter, the trained model with its adapters off stands for it."""

    key: str
    path: str | None = None
    adapters_off: bool = True

    @property
    def kind(self) -> str:
        """initial, run (a run or checkpoint directory) or hub (a Hugging Face model directory)."""
        if self.path is None:
            return "initial"
        return "hub" if (Path(self.path).expanduser() / HUB_CONFIG).is_file() else "run"


def frozen_problems(source: FrozenSource | None, cfg, data) -> list[str]:
    """Before launch: the directory exists and is one of the kinds; a Hugging Face directory goes
    with a Hugging Face model whose tokenizer gives the data's ids; an adapter that trains whole
    modules cannot stand for the initial weights with its adapters off."""
    if source is None:
        return []
    adapter = cfg.get("adapter")
    if source.kind == "initial":
        kept = list((adapter or {}).get("modules_to_save") or [])
        if adapter and source.adapters_off and kept:
            return [f"{source.key}=null with adapter.modules_to_save={kept}: the reference would be the trained model "
                    "with its adapters off, but those modules train whole and do not go back; give the reference as a "
                    f"directory ({source.key}=<a run or Hugging Face directory>), or adapter.modules_to_save=[]."]
        return []
    path = Path(source.path).expanduser()
    if not path.is_dir():
        return [f"{source.key}={source.path}: no such directory; give a run directory of this framework "
                "(outputs/<name>), a checkpoint directory, or a local Hugging Face model directory (with config.json), "
                f"or {source.key}=null for the trained model's initial weights."]
    if source.kind == "hub":
        if "pretrained" not in cfg.model:
            return [f"{source.key}={source.path} is a Hugging Face model directory, but the trained model "
                    f"({cfg.model._target_}) is not built from one; train model=hf_causal_lm, or give a run directory "
                    "of this model."]
        mismatch = tokenizer_mismatch(str(path), data)
        return [f"{source.key}: {mismatch}"] if mismatch else []
    try:
        find_checkpoint(path, source.key)
    except ConfigError as err:
        return [str(err)]
    return []


def build_frozen(source: FrozenSource, cfg, strategy, built_from: dict):
    """In each worker: the frozen model placed by `strategy` (`built_from`: the random state the
    trained model was built from). The random state the run goes on with is left as it was."""
    after = rng_state()
    node = cfg.model
    if source.kind == "initial":
        set_rng_state(built_from)
    elif source.kind == "hub":
        node = OmegaConf.merge(cfg.model, {"pretrained": str(Path(source.path).expanduser())})
    try:
        model = strategy.place_frozen(lambda: build_model(node))
    finally:
        set_rng_state(after)
    weights = getattr(strategy.unwrap(model), "pretrained_weights", None)
    if weights:  # a sharded build names its weights and each rank copies its part
        strategy.load_model_state_dict(model, initial_weights(strategy.unwrap(model), weights))
    if source.kind == "run":
        checkpoint, _, _ = find_checkpoint(Path(source.path).expanduser(), source.key)
        load_model_weights(strategy, model, checkpoint)
    return model
