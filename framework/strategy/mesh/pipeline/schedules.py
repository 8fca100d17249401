"""The pipeline schedules the framework offers, each one of torch.distributed.pipelining's, with
what it needs: how many stages a rank holds and which, how many microbatches at least, and the
idle fraction ("bubble") its theory gives. One table; strategy.schedule picks a row.

Every row was run on gloo at 2 and 4 processes with the framework's GPT stages and gave the
one-process loss and gradients (tests/construction/test_pipeline_schedules.py); the microbatch
rules are torch's own refusals, measured (1F1B: one microbatch per stage; DualPipeV: one per stage,
counting both of a rank's; the interleaved ones: a multiple of their rounds), and checked against
torch's schedules for every row at 2 and 4 ranks and 1 to 12 microbatches
(tests/strategy/test_pipeline_schedules_table.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from framework.errors import indivisible


@dataclass(frozen=True)
class Schedule:
    torch_class: str
    """The class in torch.distributed.pipelining."""
    layout: str
    """Which stages a rank holds: 'one' (stage r), 'looped' (stages r, r+p, r+2p, ...: as many as
    strategy.stages_per_rank) or 'v' (stages r and 2p-1-r: two, the first and last on rank 0)."""
    min_microbatches: str
    """'any', 'stages' (at least the pipeline's stages)."""
    note: str
    in_rounds: bool = False
    """The microbatches run in rounds of the pipeline's ranks (max(1, m // p) of them), and must be a
    multiple of their number: torch refuses m=5 at p=2 (2 rounds), runs 4 or 6."""


SCHEDULES: dict[str, Schedule] = {
    "gpipe": Schedule("ScheduleGPipe", "one", "any", "all forwards, then all backwards: every microbatch's "
                      "activations in flight at once"),
    "1f1b": Schedule("Schedule1F1B", "one", "stages", "one forward, one backward: at most p microbatches in flight"),
    "interleaved_1f1b": Schedule("ScheduleInterleaved1F1B", "looped", "any", "1F1B over several stages a rank: a "
                                 "smaller bubble, more messages", in_rounds=True),
    "looped_bfs": Schedule("ScheduleLoopedBFS", "looped", "any", "breadth first over a rank's stages"),
    "interleaved_zero_bubble": Schedule("ScheduleInterleavedZeroBubble", "looped", "any", "backward split into "
                                        "input and weight gradients to fill the bubble", in_rounds=True),
    "zbv_zero_bubble": Schedule("ScheduleZBVZeroBubble", "v", "any", "zero bubble over a V of two stages a rank"),
    "dualpipev": Schedule("ScheduleDualPipeV", "v", "stages", "DeepSeek's DualPipe over a V of two stages a rank"),
}


def stages_per_rank(name: str, requested: int) -> int:
    layout = SCHEDULES[name].layout
    return 1 if layout == "one" else 2 if layout == "v" else requested


def stage_ids(name: str, rank: int, pp: int, per_rank: int) -> list[int]:
    """The stages pipeline rank `rank` (of `pp`) holds under schedule `name`."""
    layout = SCHEDULES[name].layout
    if layout == "one":
        return [rank]
    if layout == "v":
        return [rank, 2 * pp - 1 - rank]
    return [rank + k * pp for k in range(per_rank)]


def bubble_fraction(name: str, pp: int, microbatches: int, per_rank: int = 1) -> float | None:
    """The idle share of a step by the schedule's theory: (p-1)/(m+p-1) for GPipe and 1F1B (Huang
    et al.; Narayanan et al.), (p-1)/(v m + p-1) for v stages a rank interleaved; None where the
    framework has no formula (the zero-bubble ones aim at none)."""
    if name in ("gpipe", "1f1b"):
        return (pp - 1) / (microbatches + pp - 1)
    if name in ("interleaved_1f1b", "looped_bfs"):
        return (pp - 1) / (per_rank * microbatches + pp - 1)
    return None


def schedule_problems(name: str, pp: int, per_rank: int, microbatches: int, batch_size: int) -> list[str]:
    """What stops `name` from running at these sizes, each naming the key and the fix ([] = runs)."""
    if name not in SCHEDULES:
        return [f"strategy.schedule={name} is not a schedule; choose one of {', '.join(SCHEDULES)}."]
    problems = []
    schedule = SCHEDULES[name]
    if schedule.layout == "looped" and per_rank < 2:
        problems.append(f"strategy.schedule={name} interleaves several stages a rank: set strategy.stages_per_rank "
                        "to 2 or more (or choose gpipe or 1f1b for one stage a rank).")
    stages = pp * stages_per_rank(name, per_rank)
    if microbatches < 1:
        problems.append(f"strategy.microbatches={microbatches} must be at least 1.")
    elif schedule.min_microbatches == "stages" and microbatches < stages:
        problems.append(f"strategy.schedule={name} needs at least one microbatch per stage: strategy.microbatches="
                        f"{microbatches} < {stages} stages; raise strategy.microbatches to {stages} or more.")
    rounds = max(1, microbatches // pp)
    if schedule.in_rounds and microbatches >= 1 and microbatches % rounds:
        below = microbatches - microbatches % pp
        problems.append(f"strategy.schedule={name} runs the microbatches in rounds of the {pp} pipeline ranks: "
                        f"strategy.microbatches={microbatches} is not a multiple of its {rounds} rounds; choose a "
                        f"multiple of {pp} ({below} or {below + pp}).")
    if microbatches >= 1:
        problems += indivisible(f"strategy.microbatches={microbatches}", microbatches, batch_size,
                                f"data.batch_size={batch_size} (the loss is the mean of equal microbatches)",
                                "make the batch a multiple of it.")
    return problems
