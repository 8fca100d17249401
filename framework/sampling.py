"""How the next token is chosen from the model's logits: greedy, or sampled with temperature,
top-k and top-p (nucleus) filtering, from a seeded generator (the same seed gives the same text)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from framework.errors import ConfigError


@dataclass(frozen=True)
class Sampling:
    """The decoding settings of `framework generate` (each refused with its fix when out of range)."""

    max_new_tokens: int = 64
    """Tokens to generate after the prompt (fewer when the model writes its end-of-text token)."""
    temperature: float = 1.0
    """Divides the logits before sampling: below 1 sharper, above 1 flatter; 0 means greedy."""
    top_k: int | None = None
    """Sample only among the k likeliest tokens (None: all)."""
    top_p: float | None = None
    """Sample only among the likeliest tokens whose probabilities add up to p, in (0, 1] (None: all)."""
    seed: int = 0
    """Seeds the sampling generator: the same seed, prompt and weights give the same text."""

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def problems(self) -> list[str]:
        found = []
        if self.max_new_tokens < 1:
            found.append(f"--max-new-tokens={self.max_new_tokens}: must be at least 1.")
        if self.temperature < 0:
            found.append(f"--temperature={self.temperature}: must be 0 (greedy) or positive.")
        if self.top_k is not None and self.top_k < 1:
            found.append(f"--top-k={self.top_k}: must be at least 1 (leave it out to sample among all tokens).")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            found.append(f"--top-p={self.top_p}: must be in (0, 1] (1 keeps every token; leave it out for the same).")
        return found

    def check(self) -> "Sampling":
        found = self.problems()
        if found:
            raise ConfigError("\n".join(found))
        return self


def filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """(B, V) logits with the tokens outside the top-k and the top-p nucleus set to -inf. The
    nucleus is the smallest set of likeliest tokens whose probability reaches p (the likeliest
    token is always kept)."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        before = ordered.softmax(dim=-1).cumsum(dim=-1) - ordered.softmax(dim=-1)  # mass of the likelier tokens
        drop = before >= top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def next_tokens(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> torch.Tensor:
    """(B,) the next token of each sequence from its last position's (B, V) logits."""
    if sampling.greedy:
        return logits.argmax(dim=-1)
    logits = filter_logits(logits.float() / sampling.temperature, sampling.top_k, sampling.top_p)
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(logits.device)
