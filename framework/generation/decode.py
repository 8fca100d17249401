"""The decoding loop: a prompt's token ids in, the generated ids out.

Three kinds of model:
- one with `new_cache()` (the built-in GPT): the prompt is run once (prefill) and each new token
  attends to the cached keys and values of the earlier ones; past the model's context the window
  slides and is recomputed (absolute positions cannot be shifted inside a cache);
- a Hugging Face model (`.generate` and `.config`): transformers' own generate, which has its own
  cache, with the same settings;
- any other model returning logits: the whole (cropped) sequence recomputed per token.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from framework.models.context import context_length
from framework.sampling import Sampling, next_tokens
from framework.tasks.language_modeling import output_logits


@dataclass
class Generated:
    ids: list[int]
    """The new token ids (the prompt not included)."""
    seconds: float
    """Wall time of the generation (prefill included)."""
    stopped: bool
    """Whether it stopped at the end-of-text token or the stop sequence (before max_new_tokens)."""

    @property
    def tokens_per_s(self) -> float:
        return len(self.ids) / max(self.seconds, 1e-9)


def has_own_generate(model) -> bool:
    """A Hugging Face model: transformers' generate, with its own cache, decodes it."""
    return callable(getattr(model, "generate", None)) and hasattr(model, "config")


def vocabulary_size(model) -> int | None:
    config = getattr(model, "config", None)
    if isinstance(getattr(config, "vocab_size", None), int):
        return config.vocab_size
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else getattr(model, "tok_emb", None)
    return getattr(embedding, "num_embeddings", None)


@torch.no_grad()
def generate(model, prompt: list[int], sampling: Sampling, stop_ids=(), use_cache: bool = True,
             stop: list[int] | None = None) -> Generated:
    """Generate up to sampling.max_new_tokens after `prompt`, stopping after any of `stop_ids` (the
    tokenizer's eos and its generation_config.json's stops: Tokenizer.stop_ids) or after the token
    sequence `stop` (a chat template's end of turn); the ids returned include it."""
    model.eval()
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(sampling.seed)
    start = time.perf_counter()
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    stop, stop_ids = list(stop or []), [int(i) for i in stop_ids]
    if has_own_generate(model):
        new = _hub_generate(model, ids, sampling, stop_ids, use_cache, stop)
    else:
        new = _own_generate(model, ids, sampling, stop_ids, generator, use_cache, stop)
    seconds = time.perf_counter() - start
    stopped = (bool(new) and new[-1] in stop_ids) or ends_with(new, stop)
    return Generated(new, seconds, stopped)


def ends_with(ids: list[int], stop: list[int]) -> bool:
    return bool(stop) and ids[-len(stop):] == stop


def _own_generate(model, ids: torch.Tensor, sampling: Sampling, stop_ids: list[int], generator, use_cache: bool,
                  stop: list[int]) -> list[int]:
    context = context_length(model)
    cache = model.new_cache(1) if use_cache and hasattr(model, "new_cache") else None
    new: list[int] = []
    window = ids
    for _ in range(sampling.max_new_tokens):
        if cache is not None and cache.length + window.shape[1] <= cache.capacity:
            logits = output_logits(model(window, cache=cache))[:, -1]
        else:  # no cache, or past the context: recompute the last `context` tokens
            cache = None
            logits = output_logits(model(ids[:, -context:] if context else ids))[:, -1]
        token = next_tokens(logits, sampling, generator)
        new.append(int(token))
        if new[-1] in stop_ids or ends_with(new, stop):
            break
        window = token.view(1, 1)
        ids = torch.cat([ids, window], dim=1)
    return new


def _hub_generate(model, ids: torch.Tensor, sampling: Sampling, stop_ids: list[int], use_cache: bool,
                  stop: list[int]) -> list[int]:
    from transformers import StoppingCriteria, StoppingCriteriaList

    class EndsWith(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.tensor([ends_with(row[ids.shape[1]:].tolist(), stop) for row in input_ids])

    options = {"max_new_tokens": sampling.max_new_tokens, "do_sample": not sampling.greedy, "use_cache": use_cache,
               "attention_mask": torch.ones_like(ids), "pad_token_id": stop_ids[0] if stop_ids else 0}
    if stop:
        options["stopping_criteria"] = StoppingCriteriaList([EndsWith()])
    if stop_ids:
        options["eos_token_id"] = stop_ids
    if not sampling.greedy:  # transformers draws from torch's global generator
        options.update(temperature=sampling.temperature, top_k=sampling.top_k or 0, top_p=sampling.top_p or 1.0)
        torch.manual_seed(sampling.seed)
    out = model.generate(ids, **options)
    return out[0, ids.shape[1]:].tolist()
