"""How a model's layers are split into pipeline stages (issue: pipeline stages, strategy=pipeline).

A stage holds a contiguous run of the model's repeated layers (a GPT's blocks); the first stage
also holds what comes before them (the embeddings), the last what comes after (the final norm, the
head and the loss). By default the split balances the stages' parameters, the embedding and the
head counted where they sit (a tied head is a copy of the embedding on the last stage): the
largest stage is as small as a contiguous split can make it. An explicit split names the layers
each stage holds (`strategy.layers_per_stage`).
"""
from __future__ import annotations

from collections.abc import Sequence

from framework.errors import ConfigError


def balanced_split(layer_sizes: Sequence[int], stages: int, first_extra: int = 0, last_extra: int = 0) -> list[range]:
    """Contiguous ranges of layer indices, one per stage, each at least one layer, minimising the
    largest stage's parameters (`first_extra` added to the first stage, `last_extra` to the last).
    Among splits with the same largest stage, the earlier stages take fewer layers (the first
    stage also keeps the most activations in flight under 1F1B)."""
    n = len(layer_sizes)
    _check_count(n, stages, "strategy.pipeline_parallel_size x strategy.stages_per_rank")
    prefix = [0]
    for size in layer_sizes:
        prefix.append(prefix[-1] + int(size))

    def weight(stage: int, start: int, end: int) -> int:
        extra = (first_extra if stage == 0 else 0) + (last_extra if stage == stages - 1 else 0)
        return prefix[end] - prefix[start] + extra

    # best[s][i]: the smallest largest-stage weight of the first s stages holding layers [0, i)
    infinity = float("inf")
    best = [[infinity] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for s in range(1, stages + 1):
        for i in range(s, n - (stages - s) + 1):
            for j in range(s - 1, i):  # the stage s-1 holds layers [j, i)
                candidate = max(best[s - 1][j], weight(s - 1, j, i))
                if candidate < best[s][i]:  # strict: ties keep the earliest (smallest) cut
                    best[s][i], cut[s][i] = candidate, j
    bounds, end = [], n
    for s in range(stages, 0, -1):
        start = cut[s][end]
        bounds.append(range(start, end))
        end = start
    return bounds[::-1]


def explicit_split(layers_per_stage: Sequence[int], n_layers: int, stages: int) -> list[range]:
    """The ranges `layers_per_stage` names (how many consecutive layers each stage holds)."""
    counts = list(layers_per_stage)
    key = "strategy.layers_per_stage"
    if len(counts) != stages:
        raise ConfigError(f"{key}={counts} names {len(counts)} stage(s), but the pipeline has {stages} "
                          "(strategy.pipeline_parallel_size x strategy.stages_per_rank); give one count per stage, "
                          f"or null to balance them by parameters.")
    if any(not isinstance(c, int) or c < 1 for c in counts):
        raise ConfigError(f"{key}={counts}: every stage holds at least one layer (positive integers).")
    if sum(counts) != n_layers:
        raise ConfigError(f"{key}={counts} adds up to {sum(counts)} layers, but the model has {n_layers}; "
                          "make them add up, or set it to null to balance the stages by parameters.")
    ranges, start = [], 0
    for count in counts:
        ranges.append(range(start, start + count))
        start += count
    return ranges


def _check_count(n_layers: int, stages: int, key: str) -> None:
    if stages < 1:
        raise ConfigError(f"{key} must be at least 1 (got {stages}).")
    if stages > n_layers:
        raise ConfigError(f"{key} = {stages} stages for a model of {n_layers} layer(s): every stage needs a layer; "
                          f"use at most {n_layers} stages, or a deeper model.")


def stage_sizes(layer_sizes: Sequence[int], split: Sequence[range], first_extra: int = 0,
                last_extra: int = 0) -> list[int]:
    """Each stage's parameters under `split` (what plan shows and the balance minimises)."""
    sizes = [sum(int(layer_sizes[i]) for i in part) for part in split]
    sizes[0] += first_extra
    sizes[-1] += last_extra
    return sizes
