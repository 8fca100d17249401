"""What a run needs of the machine's memory, by `framework plan`'s arithmetic: a run that cannot fit
is refused before launch (framework/planning/memory.py `beyond_memory`), and a worker killed for
memory is told what was estimated and what needs less."""
from __future__ import annotations

from framework.console import human_bytes
from framework.planning.memory import beyond_memory, estimate, model_stats


def memory_refusal(prepared) -> str | None:
    """The refusal of a run whose estimate is above the memory it would run in, or None."""
    plugins = prepared.plugins
    stats = model_stats(prepared.resolved, plugins, prepared.model, prepared.second_model[1])[0]
    return beyond_memory(plugins, stats, prepared.world_size, prepared.processes_per_node,
                         prepared.activation_bytes, MEMORY_ADVICE)


def memory_advice(prepared) -> str:
    """What `framework plan` estimated per rank for this run, and what needs less."""
    stats, _ = model_stats(prepared.resolved, prepared.plugins, prepared.model, prepared.second_model[1])
    states = estimate(prepared.plugins.strategy, stats, prepared.world_size)
    per_rank = states.device + states.host + prepared.activation_bytes
    return (f"framework plan estimated {human_bytes(per_rank)} per rank ({prepared.plugins.strategy.name}: "
            f"{states.formula} for the model states, plus one micro-batch's activations). {MEMORY_ADVICE}")


MEMORY_ADVICE = ("To need less: a smaller model, a sharding strategy (strategy=fsdp or deepspeed_stage_3), CPU offload "
                 "(fsdp_cpu_offload, deepspeed_stage_3_offload), trainer.activation_checkpointing=true, a smaller "
                 "data.batch_size (trainer.accumulate keeps the batch), or fewer processes per node (devices=...).")
