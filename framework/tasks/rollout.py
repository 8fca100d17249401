"""Sampling a prompt's group of completions inside the training loop (task=grpo's rollout).

A prompt's G completions are decoded together as G rows of one batch (the same prompt, so no
padding), from a generator seeded by the run's seed, the step and the prompt's row, never by the
rank: one process and N processes draw the same completions, and a resumed run draws what the
straight run drew. The prompt is run once and each new token against the cached keys and values:
the built-in GPT's cache (`new_cache(batch)`), or a Hugging Face model's own (`past_key_values`,
the last position's logits alone); any other model recomputes the whole sequence per token. A row
ends after a stop id; the tokens drawn after it are not part of its completion.

Where the strategy's forward is collective (fsdp, deepspeed_stage_3 and tensor parallelism gather or
reduce inside it: framework/strategy/abilities.py collective_forward) every rank decodes
`max_new_tokens` positions whatever its rows drew, so every rank calls it as often; under ddp (or
ZeRO-1/2) a rank stops once its rows have all ended.
"""
from __future__ import annotations

import inspect
import zlib
from dataclasses import dataclass
from typing import Callable

import torch

from framework.sampling import Sampling, next_tokens
from framework.tasks.token_logps import output_logits


def group_seed(seed: int, step: int, index: int) -> int:
    """The generator seed of prompt row `index`'s completions at `step` (the same on every rank)."""
    return zlib.crc32(f"{seed}/{step}/{index}".encode())


@dataclass(frozen=True)
class Ranks:
    """What a rollout needs of the processes (the loop gives it): `data_sum` sums a tensor over the
    data-parallel ranks (a tensor-parallel group's ranks hold one batch and count once);
    `collective_forward`: several processes whose forwards are collective (sharded weights, split
    layers), which every rank must call as often."""

    data_sum: Callable[[torch.Tensor], torch.Tensor]
    collective_forward: bool


ONE_PROCESS = Ranks(lambda t: t, False)


@dataclass
class Group:
    """A prompt's completions: each its token ids (a stop id included, where one was drawn)."""

    completions: list[list[int]]
    truncated: list[bool]
    """Whether a completion reached max_new_tokens without a stop id (trl's clipped)."""


def _cache_for(model, rows: int, positions: int):
    """A KV cache for `rows` sequences of `positions`, or None (no cache of its own, or too short)."""
    make = getattr(model, "new_cache", None)
    if make is None:
        return None
    cache = make(rows)
    return cache if cache.capacity >= positions else None


def keeps_past(model) -> bool:
    """Whether `model` is a Hugging Face model that can decode with its own cache (past_key_values)."""
    can_generate = getattr(model, "can_generate", None)
    return callable(can_generate) and bool(can_generate()) and hasattr(model, "config")


class _HubDecoder:
    """A Hugging Face model's forward over the new tokens, its cache kept between calls (the keyword
    `cache` of later transformers 5 releases, `past_key_values` before); only the last position's
    logits are made where the model can be told so (`logits_to_keep`)."""

    def __init__(self, model):
        self.model, self.past = model, None
        parameters = inspect.signature(model.forward).parameters
        self.keyword = "cache" if "cache" in parameters else "past_key_values"
        self.options = {"use_cache": True, **({"logits_to_keep": 1} if "logits_to_keep" in parameters else {})}

    def __call__(self, window: torch.Tensor) -> torch.Tensor:
        output = self.model(input_ids=window, **{self.keyword: self.past}, **self.options)
        self.past = getattr(output, self.keyword)
        return output_logits(output)[:, -1]


@torch.no_grad()
def sample_group(model: torch.nn.Module, prompt: list[int], generations: int, sampling: Sampling, stop_ids,
                 generator: torch.Generator, every_position: bool = False, use_cache: bool = True) -> Group:
    """`generations` completions of `prompt` (token ids), each up to sampling.max_new_tokens,
    ending after any of `stop_ids`. `every_position`: decode all max_new_tokens positions even once
    every row has stopped (the collective forwards of a sharded model)."""
    model = getattr(model, "module", model)  # DDP's or DeepSpeed's wrapper: its module decodes (no collective)
    device = next(iter(model.parameters())).device
    ids = torch.tensor([prompt] * generations, dtype=torch.long, device=device)
    stops = torch.tensor(sorted({int(i) for i in stop_ids}), dtype=torch.long)
    cache = _cache_for(model, generations, len(prompt) + sampling.max_new_tokens) if use_cache else None
    hub = _HubDecoder(model) if use_cache and cache is None and keeps_past(model) else None
    window, drawn = ids, []
    ended = torch.zeros(generations, dtype=torch.bool)
    for _ in range(sampling.max_new_tokens):
        if cache is not None:
            logits = output_logits(model(window, cache=cache))[:, -1]
        elif hub is not None:
            logits = hub(window)
        else:
            logits = output_logits(model(ids))[:, -1]
        token = next_tokens(logits, sampling, generator).cpu()
        drawn.append(token)
        ended |= torch.isin(token, stops)
        if bool(ended.all()) and not every_position:
            break
        window = token.view(generations, 1).to(device)
        ids = torch.cat([ids, window], dim=1)
    tokens = torch.stack(drawn, dim=1).tolist() if drawn else [[] for _ in range(generations)]
    completions, truncated = [], []
    stop_set = set(stops.tolist())
    for row in tokens:
        end = next((i + 1 for i, t in enumerate(row) if t in stop_set), None)
        completions.append(row[:end] if end is not None else row)
        truncated.append(end is None)
    return Group(completions, truncated)
