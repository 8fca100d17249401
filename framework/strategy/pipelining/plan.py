"""What `framework plan` says of a pipeline: each stage's layers and parameters, the most a
pipeline rank holds, the schedule's bubble and the activations its first stage keeps at once."""
from __future__ import annotations

from framework.construction.stage_modules import model_split, model_stages
from framework.strategy.pipelining.schedules import bubble_fraction, stage_ids


def _stage_sizes(strategy, world_size: int, model) -> tuple[list, list[int]]:
    split = model_split(model, strategy.stage_count(world_size), strategy.layers_per_stage)
    return split, [sum(p.numel() for p in stage.parameters()) for stage in model_stages(model, split)]


def rank_parameters(strategy, world_size: int, model) -> list[int]:
    """The parameters each pipeline rank's stages hold (a tied head's copy counted on its stage)."""
    pp = strategy.mesh_shape(world_size)[0]
    _, sizes = _stage_sizes(strategy, world_size, model)
    return [sum(sizes[i] for i in stage_ids(strategy.schedule, r, pp, strategy.per_rank)) for r in range(pp)]


def in_flight(strategy, world_size: int) -> int:
    """Microbatches whose activations the first stage keeps at once: all of them under GPipe and
    the looped schedule, the pipeline's depth under 1F1B; the others: all, as a bound."""
    pp = strategy.mesh_shape(world_size)[0]
    m = strategy.microbatches(world_size)
    return min(pp, m) if strategy.schedule == "1f1b" else m


def first_stage_activations(strategy, world_size: int, model) -> float:
    """The first pipeline rank's activations as a share of one micro-batch's through the whole
    model: the share of the layers it holds, times the microbatches in flight over their count
    (each microbatch 1/m of the batch)."""
    split, _ = _stage_sizes(strategy, world_size, model)
    pp = strategy.mesh_shape(world_size)[0]
    layers = sum(len(split[i]) for i in stage_ids(strategy.schedule, 0, pp, strategy.per_rank))
    total = max(sum(len(r) for r in split), 1)
    return layers / total * in_flight(strategy, world_size) / strategy.microbatches(world_size)


def layout_lines(strategy, world_size: int, model) -> list[str]:
    pp, dp, tp = strategy.mesh_shape(world_size)
    m = strategy.microbatches(world_size)
    lines = [f"mesh: {strategy.describe_mesh(world_size)}; each data-parallel group of {pp * tp} rank(s) passes its "
             f"batch through the stages in {m} microbatches of {strategy.loop_settings.micro_batch_size // m}"]
    if model is not None:
        split, sizes = _stage_sizes(strategy, world_size, model)
        total = sum(p.numel() for p in model.parameters())
        lines.append("stages: " + "; ".join(f"{i}: layers {r.start}-{r.stop - 1}, {size:,} parameters"
                                             for i, (r, size) in enumerate(zip(split, sizes))))
        most = max(rank_parameters(strategy, world_size, model))
        lines.append(f"the most a pipeline rank holds: {most:,} parameters ({100 * most / max(total, 1):.0f}% of the "
                     f"model's {total:,}, a tied head's copy counted: Ψs below), its optimizer state sharded over "
                     f"{dp} data-parallel rank(s)" + (", its weights and gradients whole through a step (the "
                                                      "schedule gathers them once per step)" if dp > 1 else "")
                     + (f", split over {tp} tensor-parallel ranks where the plan says" if tp > 1 else ""))
    bubble = bubble_fraction(strategy.schedule, pp, m, strategy.per_rank)
    lines.append(f"schedule {strategy.schedule}: bubble "
                 + (f"{100 * bubble:.0f}% of a step by its theory" if bubble is not None else "aimed at none")
                 + f"; the first stage keeps {in_flight(strategy, world_size)} microbatch(es) of activations at once "
                 "(the activations below: its layers' share of them)")
    return lines
