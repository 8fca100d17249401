"""What a strategy reports about how its ranks hold the model and read the data: a rank's share of
the data (the sampler and the loop read it) and the layout `framework plan` and the memory preflight
read."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DataParallel:
    """The data dealt in `size` shares, this rank computing share `rank`; `reports`: whether its
    scored samples and predictions count (one rank of each group that computes the same batch;
    every rank of a context-parallel group, whose scores are parts of one batch's); `whole_rows`:
    whether it sees whole rows (False: each sequence split over a context-parallel group)."""

    size: int
    rank: int
    reports: bool = True
    whole_rows: bool = True


@dataclass(frozen=True)
class StateLayout:
    """How a rank holds the model states (weights, gradients, optimizer state): what
    framework/planning/memory.py's formula for bytes per rank counts, with every setting it reads."""

    kind: str = "replicated"
    """replicated (every rank all of it), fully_sharded (FSDP), optimizer_sharded (fairscale's OSS),
    zero (DeepSpeed), pipelined (stages: a stage's states on its ranks)."""
    offload: bool = False
    """fully_sharded: the shards kept in CPU memory."""
    data_parallel: int = 1
    """pipelined: the ranks a stage's optimizer state is sharded over (one shard group, not its replicas)."""
    tensor_parallel: int = 1
    """pipelined: the ranks a stage's layers are split over."""
    zero_stage: int = 0
    """zero: DeepSpeed's stage."""
    offload_optimizer: str = "none"
    """zero: where the optimizer state lives (none, cpu, nvme)."""
    offload_parameters: str = "none"
    """zero: where the parameters live (stage 3)."""


@dataclass(frozen=True)
class Layout:
    """What a strategy says of how its ranks hold the model, for `framework plan` and the memory
    preflight (framework/planning/memory.py)."""

    state_shards: int
    """Ranks the sharded model states are divided over (hsdp: one shard group)."""
    lines: tuple[str, ...] = ()
    """What `framework plan` prints about the layout (a mesh, stages)."""
    held_parameters: int = 0
    """The parameters the most loaded rank holds where layers are divided among ranks (pipeline
    stages); 0: the memory formula's own share."""
    activation_share: float = 1.0
    """The share of one micro-batch's activations through the whole model a rank keeps at once
    (a pipeline's first stage: its layers, its microbatches in flight)."""
    spread_parameters: int = 0
    """Trainable parameters divided over `spread_ranks` ranks instead of state_shards: the routed
    experts under expert parallelism (each rank holds 1/spread_ranks of them, replicated over the
    other ranks, never sharded by FSDP)."""
    spread_ranks: int = 1
    states: StateLayout = StateLayout()
    """How the states lie, for the memory formula."""
