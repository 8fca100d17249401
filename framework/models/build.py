"""Building the configured model (`cfg.model`): the one place a model node is instantiated, so a
`transformers.<Class>.from_pretrained` target goes through the framework's offline loader
wherever a model is built."""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from framework.config.build import build, trusted

HF_LOADER = "framework.models.hf_causal_lm.from_pretrained"


def build_model(node: Any, key: str = "model"):
    """`build(node, key)`, a Hugging Face `from_pretrained` target (trusted first, as written)
    redirected to the framework's loader."""
    if not isinstance(node, DictConfig):
        node = OmegaConf.create(node)
    trusted(node, key)
    return build(offline_pretrained(node), key)


def offline_pretrained(node: DictConfig) -> DictConfig:
    """A `transformers.<Class>.from_pretrained` target (already trusted) goes through the framework's
    loader (framework/models/hf_causal_lm.py): offline, local directories only, and under a sharded
    build or the pre-launch check the structure without the weights, which are then read into
    shards (transformers' own from_pretrained refuses the meta device)."""
    target = str(node.get("_target_", ""))
    if not (target.startswith("transformers.") and target.endswith(".from_pretrained")):
        return node
    rewritten = OmegaConf.to_container(node, resolve=False)
    rewritten.update({"_target_": HF_LOADER, "model_class": target.rsplit(".", 1)[0]})
    return OmegaConf.create(rewritten)
