"""What `framework plan` says of a pipeline: each stage's layers and parameters, the most a
pipeline rank holds, the schedule's bubble and the microbatches whose activations its first stage
keeps at once."""
from __future__ import annotations

from framework.construction.stage_modules import model_stages
from framework.strategy.mesh.dims import ParallelDims
from framework.strategy.mesh.pipeline.schedules import bubble_fraction
from framework.strategy.mesh.pipeline.settings import PipelineSettings


def _stage_sizes(settings: PipelineSettings, dims: ParallelDims, model) -> tuple[list, list[int]]:
    split = settings.split(model, dims.pipeline)
    return split, [sum(p.numel() for p in stage.parameters()) for stage in model_stages(model, split)]


def rank_parameters(settings: PipelineSettings, dims: ParallelDims, model) -> list[int]:
    """The parameters each pipeline rank's stages hold (a tied head's copy counted on its stage)."""
    _, sizes = _stage_sizes(settings, dims, model)
    return [sum(sizes[i] for i in settings.stages_of(r, dims.pipeline)) for r in range(dims.pipeline)]


def in_flight(settings: PipelineSettings, dims: ParallelDims) -> int:
    """Microbatches whose activations the first stage keeps at once: all of them under GPipe and
    the looped schedule, the pipeline's depth under 1F1B; the others: all, as a bound."""
    m = settings.microbatch_count(dims.pipeline)
    return min(dims.pipeline, m) if settings.schedule == "1f1b" else m


def first_stage_activations(settings: PipelineSettings, dims: ParallelDims, model) -> float:
    """The first pipeline rank's activations as a share of one micro-batch's through the whole
    model: the share of the layers it holds, times the microbatches in flight over their count
    (each microbatch 1/m of the batch)."""
    split, _ = _stage_sizes(settings, dims, model)
    layers = sum(len(split[i]) for i in settings.stages_of(0, dims.pipeline))
    total = max(sum(len(r) for r in split), 1)
    return layers / total * in_flight(settings, dims) / settings.microbatch_count(dims.pipeline)


def describe_pipeline(settings: PipelineSettings, dims: ParallelDims) -> str:
    return (f"{dims.describe()}, {settings.stage_count(dims.pipeline)} stages, schedule {settings.schedule}, "
            f"{settings.microbatch_count(dims.pipeline)} microbatches")


def layout_lines(settings: PipelineSettings, dims: ParallelDims, model, micro_batch_size: int) -> list[str]:
    pp, dp, tp = dims.pipeline, dims.shard, dims.tensor  # the optimizer state: over a shard group (not its replicas)
    m = settings.microbatch_count(pp)
    replicas = f" (x {dims.replicate} replicas)" if dims.replicate > 1 else ""
    lines = [f"mesh: {describe_pipeline(settings, dims)}; each data-parallel group of {pp * tp} rank(s) passes its "
             f"batch through the stages in {m} microbatches of {micro_batch_size // m}"]
    if model is not None:
        split, sizes = _stage_sizes(settings, dims, model)
        total = sum(p.numel() for p in model.parameters())
        lines.append("stages: " + "; ".join(f"{i}: layers {r.start}-{r.stop - 1}, {size:,} parameters"
                                             for i, (r, size) in enumerate(zip(split, sizes))))
        most = max(rank_parameters(settings, dims, model))
        lines.append(f"the most a pipeline rank holds: {most:,} parameters ({100 * most / max(total, 1):.0f}% of the "
                     f"model's {total:,}, a tied head's copy counted: Ψs below), its optimizer state sharded over "
                     f"{dp} data-parallel rank(s)" + replicas + (", its weights and gradients whole through a step (the "
                                                      "schedule gathers them once per step)" if dp > 1 else "")
                     + (f", split over {tp} tensor-parallel ranks where the plan says" if tp > 1 else ""))
    bubble = bubble_fraction(settings.schedule, pp, m, settings.per_rank)
    lines.append(f"schedule {settings.schedule}: bubble "
                 + (f"{100 * bubble:.0f}% of a step by its theory" if bubble is not None else "aimed at none")
                 + f"; the first stage keeps {in_flight(settings, dims)} microbatch(es) of activations at once "
                 "(the activations below: its layers' share of them)")
    return lines
