"""The schedule table of strategy=pipeline (framework/strategy/pipelining/schedules.py): which
stages a rank holds, the microbatch minimums torch enforces (measured at 4 processes: 1F1B refused
3 microbatches for 4 stages, DualPipeV 6 for 8), the bubble's theory, and the refusals' keys."""
from __future__ import annotations

import pytest

from framework.strategy.pipelining.schedules import (
    SCHEDULES,
    bubble_fraction,
    schedule_problems,
    stage_ids,
    stages_per_rank,
)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("pp", [1, 2, 4])
def test_every_stage_is_held_by_exactly_one_rank(name, pp):
    per_rank = stages_per_rank(name, 3)
    held = sorted(i for rank in range(pp) for i in stage_ids(name, rank, pp, per_rank))
    assert held == list(range(pp * per_rank))
    assert 0 in stage_ids(name, 0, pp, per_rank)  # rank 0 feeds the pipeline


def test_the_v_schedules_put_the_first_and_last_stage_on_rank_zero():
    assert stage_ids("zbv_zero_bubble", 0, 4, 2) == [0, 7] and stage_ids("dualpipev", 3, 4, 2) == [3, 4]


def test_the_microbatch_minimums_are_torchs():
    assert schedule_problems("gpipe", 4, 1, 1, 8) == []
    assert schedule_problems("1f1b", 4, 1, 4, 8) == []
    (problem,) = schedule_problems("1f1b", 4, 1, 3, 9)
    assert "strategy.microbatches=3 < 4 stages" in problem and "raise strategy.microbatches to 4" in problem
    (problem,) = schedule_problems("dualpipev", 4, 2, 6, 12)
    assert "< 8 stages" in problem
    assert schedule_problems("interleaved_1f1b", 4, 2, 1, 8) == []


def test_refusals_name_their_keys():
    (problem,) = schedule_problems("gpipe", 2, 1, 3, 8)
    assert "data.batch_size=8 does not split into strategy.microbatches=3" in problem
    (problem,) = schedule_problems("interleaved_1f1b", 2, 1, 4, 8)
    assert "strategy.stages_per_rank" in problem
    (problem,) = schedule_problems("pipedream", 2, 1, 4, 8)
    assert "strategy.schedule=pipedream is not a schedule" in problem and "gpipe" in problem


def test_the_bubble_of_the_theory():
    assert bubble_fraction("gpipe", 4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction("1f1b", 1, 8) == 0.0
    assert bubble_fraction("interleaved_1f1b", 4, 8, 2) == pytest.approx(3 / 19)
    assert bubble_fraction("zbv_zero_bubble", 4, 8, 2) is None
