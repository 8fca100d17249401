"""Bytes per rank for the model states (weights, gradients, optimizer state) under a strategy.

Ψ parameters, N ranks, L parameters in the largest unit gathered at once (Ψe of them routed experts
spread over E ranks under expert parallelism; Ψs a pipeline rank's). The formulas are the
ones in shared/FACTS.md (DeepSpeed's own estimators agree), generalised from fp32 + Adam to the
chosen precision and optimizer. Activations and temporary buffers are not counted: they depend on
the batch, not on the strategy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from framework.console import human_bytes
from framework.strategy.deepspeed.sizes import NVME_OPTIMIZER_BUFFERS, NVME_PARAM_BUFFERS


@dataclass(frozen=True)
class ModelStats:
    params: int
    """Ψ: trainable parameters."""
    largest_unit: int
    """L: parameters of the largest unit gathered at once (a sharding unit, else the largest layer)."""
    param_bytes: int = 4
    """Bytes per stored weight (4 float32, 2 true half, 8 float64)."""
    mixed_half: bool = False
    """Compute in 16 bits over float32 weights (precision=16 / bf16)."""
    optimizer_states: int = 2
    """Optimizer state tensors per parameter (Adam 2, SGD with momentum 1, plain SGD 0)."""
    frozen_bytes: int = 0
    """Bytes of weights that never train (a quantized precision's frozen layers, an adapter's base
    model, a task's frozen second model: a preference task's reference): no gradient or optimizer
    state; sharded like the rest of the weights where a strategy shards weights (fsdp, ZeRO-3), else
    held whole by every rank."""
    largest_param: int = 0
    """Elements of the largest trainable parameter (NVMe offload swaps one parameter per buffer)."""
    held_params: int = 0
    """Ψs: the parameters the most loaded pipeline rank holds (a pipeline's Layout.held_parameters)."""
    spread_params: int = 0
    """Ψe: trainable parameters spread over `spread_ranks` ranks, not sharded over all of them (the
    routed experts under expert parallelism: Layout.spread_parameters)."""
    spread_ranks: int = 1
    """E: the ranks Ψe is divided over (strategy.expert_parallel_size)."""


@dataclass(frozen=True)
class MemoryEstimate:
    device: float
    """Bytes per rank on the accelerator."""
    host: float = 0.0
    """Bytes per rank offloaded to CPU memory (offload strategies; with NVMe offload what stays in RAM:
    the float32 gradient partition and the swap buffers)."""
    formula: str = ""
    """The device formula in Ψ, L, N (for the printout)."""
    disk: float = 0.0
    """Bytes per rank swapped to the NVMe folder (strategy.nvme_path)."""


def _coefficient(value: float) -> str:
    return f"{value:g}"


def replicated(stats: ModelStats) -> MemoryEstimate:
    """Every rank holds everything: weights + gradients + optimizer state (DDP, single device)."""
    per_param = stats.param_bytes * (2 + stats.optimizer_states)
    frozen = f" + {human_bytes(stats.frozen_bytes)} frozen" if stats.frozen_bytes else ""
    return MemoryEstimate(per_param * stats.params + stats.frozen_bytes, formula=f"{_coefficient(per_param)}Ψ{frozen}")


def fully_sharded(stats: ModelStats, world_size: int, offload: bool = False) -> MemoryEstimate:
    """FSDP: all states sharded over N ranks, plus one gathered unit's weights and gradients."""
    per_param = stats.param_bytes * (2 + stats.optimizer_states)
    gathered = 2 * stats.param_bytes * stats.largest_unit
    spread = stats.spread_params  # experts: each rank holds 1/E of them, whatever N
    sharded = per_param * ((stats.params - spread) / world_size + spread / stats.spread_ranks)
    sharded += stats.frozen_bytes / world_size
    frozen = f" + {human_bytes(stats.frozen_bytes)} frozen/N" if stats.frozen_bytes else ""
    states = (f"{_coefficient(per_param)}(Ψ-Ψe)/N + {_coefficient(per_param)}Ψe/E" if spread
              else f"{_coefficient(per_param)}Ψ/N")
    if offload:
        return MemoryEstimate(gathered, sharded, f"{_coefficient(2 * stats.param_bytes)}L")
    return MemoryEstimate(sharded + gathered, formula=f"{states} + {_coefficient(2 * stats.param_bytes)}L{frozen}")


def pipelined(stats: ModelStats, data_parallel: int, tensor_parallel: int) -> MemoryEstimate:
    """Pipeline stages: the most loaded pipeline rank's Ψs parameters, their weights and gradients
    whole on every data-parallel rank through a step (torch's schedule gathers a stage's FSDP2
    weights once a step and reduces its gradients after the last microbatch), their optimizer state
    sharded over the data-parallel ranks; all of it split over the tensor-parallel ranks."""
    held = stats.held_params or stats.params
    whole, sharded = 2 * stats.param_bytes, stats.param_bytes * stats.optimizer_states
    t = f"/{tensor_parallel}" if tensor_parallel > 1 else ""
    d = f"/{data_parallel * tensor_parallel}" if data_parallel * tensor_parallel > 1 else ""
    formula = (f"{_coefficient(whole + sharded)}Ψs{t}" if data_parallel == 1
               else f"{_coefficient(whole)}Ψs{t} + {_coefficient(sharded)}Ψs{d}")
    return MemoryEstimate(whole * held / tensor_parallel + sharded * held / (data_parallel * tensor_parallel),
                          formula=formula)


def optimizer_sharded(stats: ModelStats, world_size: int) -> MemoryEstimate:
    """Weights replicated, gradients and optimizer state sharded (fairscale OSS + ShardedDDP)."""
    p = stats.param_bytes
    sharded = p * (1 + stats.optimizer_states)
    frozen = f" + {human_bytes(stats.frozen_bytes)} frozen" if stats.frozen_bytes else ""
    return MemoryEstimate(p * stats.params + sharded * stats.params / world_size + stats.frozen_bytes,
                          formula=f"{_coefficient(p)}Ψ + {_coefficient(sharded)}Ψ/N{frozen}")


def zero(stats: ModelStats, world_size: int, stage: int, offload_optimizer: str = "none",
         offload_parameters: str = "none") -> MemoryEstimate:
    """DeepSpeed ZeRO: each rank keeps the module's weights (2 bytes in mixed half precision, 4 in
    float32), a float32 master copy of its partition (4; stages 1 and 2 make one in float32
    training too, stage 3 then uses the weight partition itself: deepspeed_master_weights.py),
    the float32 gradient partition (4) and Adam state (8 for two states). Stage 3 also holds the
    largest unit gathered, its weights and gradients in the module's dtype (DeepSpeed's own
    estimator's 4L in half precision; 8L in float32). offload_optimizer / offload_parameters: none, cpu
    or nvme; what goes to NVMe is counted on disk, and RAM keeps DeepSpeed's swap buffers instead
    (framework/strategy/deepspeed/sizes.py sizes them)."""
    w = 2 if stats.mixed_half else 4
    live = 2 * w  # bytes per parameter of the gathered unit: weights and gradients
    master = 0 if stage == 3 and w == 4 and offload_optimizer == "none" else 4
    grad32 = 4
    states = 4 * stats.optimizer_states
    psi, n = stats.params, world_size
    if stage <= 1:
        replicated_part = (w + w) if stage == 1 else (w + w + master + states + grad32)
        sharded = (master + states + grad32) if stage == 1 else 0
        formula = f"{_coefficient(replicated_part)}Ψ" + (f" + {_coefficient(sharded)}Ψ/N" if sharded else "")
    elif stage == 2:
        replicated_part, sharded = w, w + master + states + grad32
        formula = f"{_coefficient(w)}Ψ + {_coefficient(sharded)}Ψ/N"
    else:
        replicated_part, sharded = 0, w + master + states + grad32
        formula = f"{live}L + {_coefficient(sharded)}Ψ/N"
    device = replicated_part * psi + sharded * psi / n + (live * stats.largest_unit if stage == 3 else 0)
    if stats.frozen_bytes:  # weights without gradients or optimizer state: partitioned by ZeRO-3 alone
        device += stats.frozen_bytes / n if stage == 3 else stats.frozen_bytes
        formula += f" + {human_bytes(stats.frozen_bytes)} frozen{'/N' if stage == 3 else ''}"
    host = disk = 0.0
    if offload_optimizer != "none" and stage >= 1:
        keep = w if stage == 3 and offload_parameters == "none" else 0  # the weight shard stays unless offloaded too
        host = (sharded - keep) * psi / n
        device -= host
        formula = (f"{_coefficient(replicated_part)}Ψ" if stage < 3 else f"{live}L") + (f" + {_coefficient(keep)}Ψ/N" if keep else "")
        if stage < 3 and replicated_part == 0:
            formula = "0"
        if offload_optimizer == "nvme":  # master weights and Adam state: swapped per sub group; DeepSpeed keeps
            optimizer_part = (master + states) * psi / n  # the float32 gradient partition in RAM (grad32)
            disk += optimizer_part
            unit = max(stats.largest_unit, 1) + math.ceil(stats.largest_param / n)
            host += NVME_OPTIMIZER_BUFFERS * 4 * unit + 4 * unit - optimizer_part
        if offload_parameters == "nvme" and stage == 3:  # the weight shards: swapped one parameter at a time
            disk += w * psi / n
            host += NVME_PARAM_BUFFERS * w * math.ceil(stats.largest_param / n) - w * psi / n
    return MemoryEstimate(device, host, formula, disk)


def estimate(strategy, stats: ModelStats, world_size: int) -> MemoryEstimate:
    """Bytes per rank under `strategy`, by the states of its layout (`strategy.layout(world)`:
    framework/strategy/layout.py StateLayout, with every setting its formula reads; a mesh layout's
    from its appliers). Under SPMD one process drives all of a node's devices, so states shard over
    every device of every process."""
    layout = strategy.layout(world_size)
    shards, states = layout.state_shards, layout.states
    if states.kind == "fully_sharded":
        return fully_sharded(stats, shards, offload=states.offload)
    if states.kind == "optimizer_sharded":
        return optimizer_sharded(stats, shards)
    if states.kind == "pipelined":
        return pipelined(stats, states.data_parallel, states.tensor_parallel)
    if states.kind == "zero":
        return zero(stats, shards, states.zero_stage, states.offload_optimizer, states.offload_parameters)
    if states.kind != "replicated":
        raise ValueError(f"{type(strategy).__name__}'s layout states kind={states.kind!r}: use one of replicated, "
                         "fully_sharded, optimizer_sharded, zero, pipelined")
    return replicated(stats)


def optimizer_states(cfg: DictConfig) -> int:
    """State tensors per parameter for the configured optimizer (Adam-family 2, SGD 0 or 1)."""
    target = str(cfg.optimizer.get("_target_", ""))
    if "SGD" in target:
        return 1 if cfg.optimizer.get("momentum", 0) else 0
    return 2  # Adam, AdamW, and a safe upper bound for the rest


def model_stats(cfg: DictConfig, plugins, model, second_params: int = 0):
    """Trainable parameters, the largest unit gathered at once (by the units the strategy would
    shard: the same rule as the run, framework/construction/units.py), and the byte sizes that the
    strategies' memory formulas need, for the model built on the meta device; `second_params`: a
    task's frozen second model's (framework/tasks/frozen.py), weights held as the trained model's."""
    precision = plugins.precision
    quantized_params, quantized_bytes = precision.frozen_weights(model)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)  # an adapter's base model
    if frozen:  # QLoRA: the precision quantizes the adapted model's frozen layers
        frozen -= quantized_params
    else:  # a quantized precision alone freezes the layers it quantizes
        params -= quantized_params
    units = plugins.strategy.units(model)
    param_bytes = torch.empty((), dtype=precision.param_dtype).element_size()
    frozen_bytes = quantized_bytes + (frozen + second_params) * param_bytes
    mixed_half = precision.param_dtype == torch.float32 and precision.compute_dtype in (torch.float16, torch.bfloat16)
    largest = max((p.numel() for p in model.parameters() if p.requires_grad), default=0)
    layout = plugins.strategy.layout(plugins.strategy.devices * plugins.strategy.num_nodes, model)
    stats = ModelStats(params, units.largest or params, param_bytes, mixed_half, optimizer_states(cfg), frozen_bytes,
                       largest, layout.held_parameters, layout.spread_parameters, layout.spread_ranks)
    return stats, units


def beyond_memory(plugins, stats: ModelStats, world_size: int, processes_on_node: int, activation_bytes: int,
                  advice: str) -> str | None:
    """A refusal when the run cannot fit the machine it would run on, by `framework plan`'s own
    arithmetic (model states by the strategy's formula, one micro-batch's activations measured on the
    meta device): on the CPU every process of the node shares the RAM; on an accelerator one rank's
    share must fit one device. A lower bound (buffers, the allocator, the loader are not counted), so
    only what cannot possibly fit is refused; None when it may fit or the memory is not known."""
    accelerator = plugins.accelerator
    memory = accelerator.memory_bytes() if accelerator.is_available() else None
    if not memory:
        return None
    states = estimate(plugins.strategy, stats, world_size)
    per_rank = states.device + activation_bytes + (states.host if accelerator.name == "cpu" else 0)
    need = per_rank * processes_on_node if accelerator.name == "cpu" else per_rank
    if need <= memory:
        return None
    where = (f"{processes_on_node} process(es) on this node need {human_bytes(need)}, more than its "
             f"{human_bytes(memory)} of RAM" if accelerator.name == "cpu"
             else f"more than one {accelerator.name} device's {human_bytes(memory)}")
    machine = "the machine planned for" if type(accelerator).__name__ == "PlannedAccelerator" else "this machine"
    return (f"memory: the run cannot fit {machine}: {human_bytes(per_rank)} per rank by framework plan's arithmetic "
            f"({stats.params:,} trainable parameters; model states {states.formula} = {human_bytes(states.device)}"
            f"{f' + {human_bytes(states.host)} offloaded' if states.host else ''}, one micro-batch's activations "
            f"{human_bytes(activation_bytes)}): {where}. {advice}")
