"""The schedule table of strategy=pipeline (framework/strategy/mesh/pipeline/schedules.py): which
stages a rank holds, the microbatch rules torch enforces, the bubble's theory, and the refusals'
keys. The microbatch rules are checked against torch's own schedule classes: for every schedule, at
2 and 4 pipeline ranks and 1 to 12 microbatches, the table refuses exactly what torch refuses when
the schedule is built (a refusal there would otherwise come at the first step, in the workers). The
stages are real PipelineStages of rank 0, told their group by stand-ins for torch.distributed's
rank and size (no process group needed)."""
from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.distributed.pipelining as pipelining

from framework.strategy.mesh.pipeline.schedules import (
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
    assert "strategy.microbatches=3 does not divide data.batch_size=8" in problem
    (problem,) = schedule_problems("interleaved_1f1b", 2, 1, 4, 8)
    assert "strategy.stages_per_rank" in problem
    (problem,) = schedule_problems("pipedream", 2, 1, 4, 8)
    assert "strategy.schedule=pipedream is not a schedule" in problem and "gpipe" in problem


def test_the_bubble_of_the_theory():
    assert bubble_fraction("gpipe", 4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction("1f1b", 1, 8) == 0.0
    assert bubble_fraction("interleaved_1f1b", 4, 8, 2) == pytest.approx(3 / 19)
    assert bubble_fraction("zbv_zero_bubble", 4, 8, 2) is None


STAGES_PER_RANK = 2  # for the looped schedules; 'one' and 'v' decide their own


def torch_refusal(name: str, pp: int, microbatches: int) -> str | None:
    per_rank = stages_per_rank(name, STAGES_PER_RANK)
    count = pp * per_rank
    with mock.patch.object(dist, "get_world_size", lambda group=None: pp), \
            mock.patch.object(dist, "get_rank", lambda group=None: 0), \
            mock.patch.object(dist, "is_initialized", lambda: True):
        stages = [pipelining.PipelineStage(torch.nn.Linear(2, 2), i, count, torch.device("cpu"))
                  for i in stage_ids(name, 0, pp, per_rank)]
        schedule = getattr(pipelining, SCHEDULES[name].torch_class)
        try:
            schedule(stages[0] if per_rank == 1 else stages, n_microbatches=microbatches, loss_fn=lambda out, y: out.sum())
        except ValueError as err:
            return str(err)
    return None


@pytest.mark.parametrize("name", SCHEDULES)
def test_the_table_refuses_what_torch_refuses(name):
    disagree = []
    for pp in (2, 4):
        for microbatches in range(1, 13):
            ours = schedule_problems(name, pp, STAGES_PER_RANK, microbatches, batch_size=microbatches * 4)
            theirs = torch_refusal(name, pp, microbatches)
            if bool(ours) != bool(theirs):
                disagree.append((pp, microbatches, ours, theirs))
    assert not disagree, disagree


def test_the_interleaved_rounds_rule_names_the_key_and_multiples_that_run():
    (problem,) = schedule_problems("interleaved_1f1b", 2, 2, 5, batch_size=20)
    assert problem == ("strategy.schedule=interleaved_1f1b runs the microbatches in rounds of the 2 pipeline ranks: "
                       "strategy.microbatches=5 is not a multiple of its 2 rounds; choose a multiple of 2 (4 or 6).")
    assert schedule_problems("interleaved_1f1b", 2, 2, 6, batch_size=12) == []
