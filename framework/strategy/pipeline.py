"""`strategy=pipeline`: pipeline stages x FSDP2 (x tensor parallelism), on torch.distributed.pipelining.

A preset of the mesh strategy (framework/strategy/mesh/) whose layout has the pipeline dimension,
outermost on a (pipeline, shard, tensor) mesh. Each pipeline rank holds one or more contiguous
stages of the model's layers (framework/construction/stages.py: balanced by parameters, or
`layers_per_stage`); a step's batch goes through them in `microbatches` pieces in the order a torch
schedule sets (framework/strategy/mesh/pipeline/schedules.py). Across the data-parallel ranks each
stage is sharded by FSDP2 and each group reads its own batches; with `tensor_parallel_size` > 1
each stage's layers are also split over a tensor-parallel group as strategy=model_parallel splits
them. Built on the meta device: a rank materialises only its stages' layers (its shards). How the
numbers stay the unpipelined step's: framework/strategy/mesh/pipeline/run.py.
"""
from __future__ import annotations

from typing import Literal

from framework.config.types import PositiveInt
from framework.strategy.mesh.dims import DimsSettings
from framework.strategy.mesh.pipeline.settings import PipelineSettings
from framework.strategy.mesh.strategy import MeshStrategy
from framework.strategy.mesh.tensor_parallel import TensorParallelSettings

DEFAULT = PipelineSettings()


class PipelineStrategy(MeshStrategy):
    """Pipeline stages over `pipeline_parallel_size` ranks x FSDP2 over the data-parallel ranks x
    tensor parallelism within each stage (torchtitan's PP x FSDP x TP; tensor_parallel_size 1 by
    default)."""

    name = "pipeline"

    def __init__(self, *args, pipeline_parallel_size: PositiveInt | Literal["auto"] = "auto",
                 schedule: str = DEFAULT.schedule, microbatches: PositiveInt | Literal["auto"] = DEFAULT.microbatches,
                 stages_per_rank: PositiveInt = DEFAULT.stages_per_rank,
                 layers_per_stage: list[int] | None = DEFAULT.layers_per_stage,
                 tensor_parallel_size: PositiveInt | Literal["auto"] = 1,
                 data_parallel_size: PositiveInt | Literal["auto"] = "auto", tp_plan: dict[str, str] | None = None,
                 shard_size: PositiveInt | Literal["auto"] | None = None, **kwargs):
        """pipeline_parallel_size: ranks a batch passes through, one stage group each ('auto': every
        rank); schedule: gpipe, 1f1b, interleaved_1f1b, looped_bfs, interleaved_zero_bubble,
        zbv_zero_bubble or dualpipev; microbatches: pieces each rank's batch is cut into ('auto':
        the pipeline's stage count, the least 1F1B takes); stages_per_rank: stages each rank holds
        under the interleaved schedules (the V schedules: 2); layers_per_stage: how many
        consecutive layers each stage holds (null: balanced by parameters); tensor_parallel_size:
        ranks that split each stage's layers (1: none; 'auto': the devices of one node that the ranks
        over pipeline_parallel_size x data_parallel_size allow), by the model's plan or tp_plan (as
        under strategy=model_parallel); data_parallel_size: groups that read different batches
        ('auto': the ranks the other two leave); shard_size: ranks of a node that shard the states,
        the data-parallel groups beyond them replicas (null: all shard; 'auto': one node). The mesh
        strategy's keys (framework/strategy/mesh/strategy.py) apply to the data-parallel sharding of
        each stage."""
        pipeline = PipelineSettings(schedule, microbatches, stages_per_rank,
                                    None if layers_per_stage is None else tuple(layers_per_stage))
        plan = None if tp_plan is None else dict(tp_plan)
        super().__init__(*args, dims=DimsSettings(pipeline=pipeline_parallel_size, data_parallel=data_parallel_size,
                                                  tensor=tensor_parallel_size, shard=shard_size),
                         pipeline=pipeline, tensor=TensorParallelSettings(plan), **kwargs)
        self.pipeline_parallel_size = pipeline_parallel_size
        self.tensor_parallel_size = tensor_parallel_size
