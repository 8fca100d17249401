"""Pipeline stage splits (framework/construction/stages.py): balanced by parameters, or as named."""
from __future__ import annotations

import itertools

import pytest

from framework.construction.stages import balanced_split, explicit_split, stage_sizes
from framework.errors import ConfigError


def brute_force_best(sizes, stages, first_extra, last_extra) -> int:
    """The smallest largest stage over every contiguous split (small cases only)."""
    n, best = len(sizes), None
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = [0, *cuts, n]
        split = [range(a, b) for a, b in zip(bounds, bounds[1:])]
        largest = max(stage_sizes(sizes, split, first_extra, last_extra))
        best = largest if best is None else min(best, largest)
    return best


@pytest.mark.parametrize("sizes,stages,first,last", [
    ([10] * 8, 2, 0, 0), ([10] * 8, 4, 0, 0), ([10] * 8, 2, 25, 25), ([10] * 12, 4, 40, 40),
    ([3, 9, 1, 7, 7, 2, 8], 3, 5, 0), ([1] * 5, 5, 0, 0), ([5, 1, 1, 1, 1, 1, 1, 5], 3, 0, 12),
])
def test_the_balanced_split_is_contiguous_complete_and_optimal(sizes, stages, first, last):
    split = balanced_split(sizes, stages, first, last)
    assert len(split) == stages and all(len(part) >= 1 for part in split)
    assert [i for part in split for i in part] == list(range(len(sizes)))  # every layer once, in order
    assert max(stage_sizes(sizes, split, first, last)) == brute_force_best(sizes, stages, first, last)


def test_an_embedding_and_a_head_move_layers_to_the_middle():
    # 8 equal blocks of 10, an embedding of 25 on the first stage and a tied head's copy (25) on the
    # last: the first and last stages take fewer blocks
    assert [len(p) for p in balanced_split([10] * 8, 4, 25, 25)] == [1, 3, 3, 1]
    assert [len(p) for p in balanced_split([10] * 8, 2)] == [4, 4]


def test_an_explicit_split_is_taken_as_named_and_checked():
    assert explicit_split([3, 5], 8, 2) == [range(0, 3), range(3, 8)]
    with pytest.raises(ConfigError, match=r"adds up to 7 layers, but the model has 8"):
        explicit_split([3, 4], 8, 2)
    with pytest.raises(ConfigError, match=r"names 3 stage\(s\), but the pipeline has 2"):
        explicit_split([3, 4, 1], 8, 2)
    with pytest.raises(ConfigError, match="at least one layer"):
        explicit_split([8, 0], 8, 2)


def test_more_stages_than_layers_is_refused_with_the_key():
    with pytest.raises(ConfigError, match=r"5 stages for a model of 4 layer\(s\).*at most 4 stages"):
        balanced_split([1] * 4, 5)
