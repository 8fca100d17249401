"""The positions a model takes: what generation crops to and what a prompt and its completion must fit."""
from __future__ import annotations


def context_length(model) -> int | None:
    """The longest sequence the model takes (the built-in GPT's block_size, a Hugging Face config's
    max_position_embeddings, n_positions, n_ctx or seq_length); None: not known."""
    if hasattr(model, "block_size"):
        return int(model.block_size)
    config = getattr(model, "config", None)
    for field in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        value = getattr(config, field, None)
        if isinstance(value, int):
            return value
    return None
