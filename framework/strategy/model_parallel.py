"""`strategy=model_parallel`: FSDP2 over data-parallel ranks x tensor parallelism on a 2-D mesh,
and with `pipeline_parallel_size` > 1 a third dimension, pipeline stages outermost: one option
spells every mesh from 1-D to 3-D, as torchtitan's parallelism settings do. A preset of the mesh
strategy (framework/strategy/mesh/); within a data-parallel group every rank of a tensor-parallel
group computes the same batch with its share of each split layer (heads, MLP hidden units:
framework/construction/tensor_parallel.py)."""
from __future__ import annotations

from typing import Literal

from framework.config.types import PositiveInt
from framework.errors import ConfigError
from framework.strategy.mesh.dims import DimsSettings
from framework.strategy.mesh.pipeline.settings import PipelineSettings
from framework.strategy.mesh.strategy import MeshStrategy
from framework.strategy.mesh.tensor_parallel import TensorParallelSettings

DEFAULT = PipelineSettings()  # the pipeline keys' defaults, written once (they act only with stages)


class ModelParallelStrategy(MeshStrategy):
    """FSDP2 x tensor parallelism (Lightning's ModelParallelStrategy, torchtitan's FSDP x TP), x
    pipeline stages with `pipeline_parallel_size` > 1 (torchtitan's PP x FSDP x TP)."""

    name = "model_parallel"

    def __init__(self, *args, tensor_parallel_size: PositiveInt | Literal["auto"] = "auto",
                 data_parallel_size: PositiveInt | Literal["auto"] = "auto", sequence_parallel: bool = False,
                 tp_plan: dict[str, str] | None = None, pipeline_parallel_size: PositiveInt = 1,
                 schedule: str = DEFAULT.schedule, microbatches: PositiveInt | Literal["auto"] = DEFAULT.microbatches,
                 stages_per_rank: PositiveInt = DEFAULT.stages_per_rank,
                 layers_per_stage: list[int] | None = DEFAULT.layers_per_stage,
                 shard_size: PositiveInt | Literal["auto"] | None = None, **kwargs):
        """tensor_parallel_size: ranks that split each layer ('auto': the devices of one node, so
        the layers' frequent collectives stay on the fast link; with stages: as many as the ranks
        over pipeline_parallel_size x data_parallel_size allow); data_parallel_size: groups that
        read different batches and shard the rest with FSDP2 ('auto': the ranks the others leave);
        sequence_parallel: the norms and the activations between split layers also split along
        the sequence (less activation memory; the model's plan must say where: the built-in GPT's
        does); tp_plan: {module name or glob: style} to split a model that has no plan of its own,
        or to replace its plan (styles: framework/construction/tensor_parallel.py);
        pipeline_parallel_size: ranks a batch passes through, one stage group each (1: no
        pipeline); schedule, microbatches, stages_per_rank, layers_per_stage: the pipeline's
        (conf/strategy/pipeline.yaml says what each does), only with pipeline_parallel_size > 1;
        shard_size: ranks of a node that shard the states, the data-parallel groups beyond them
        holding replicas (hybrid sharding; null: every data-parallel rank shards; 'auto': one node).
        The mesh strategy's keys (framework/strategy/mesh/strategy.py) apply to the
        data-parallel sharding."""
        given = {"schedule": schedule, "microbatches": microbatches, "stages_per_rank": stages_per_rank,
                 "layers_per_stage": layers_per_stage}
        pipeline = PipelineSettings(schedule, microbatches, stages_per_rank,
                                    None if layers_per_stage is None else tuple(layers_per_stage))
        if pipeline_parallel_size == 1:
            for key, value in given.items():
                if value != getattr(DEFAULT, key):
                    raise ConfigError(f"strategy.{key}={value} sets the pipeline, but strategy.pipeline_parallel_size "
                                      "is 1 (no stages); set strategy.pipeline_parallel_size to the number of pipeline "
                                      f"ranks, or drop strategy.{key}.")
            pipeline = None
        elif sequence_parallel:
            raise ConfigError(f"strategy.sequence_parallel=true with strategy.pipeline_parallel_size="
                              f"{pipeline_parallel_size}: pipeline stages pass whole activations between them, "
                              "not a sequence split over the tensor-parallel ranks; set "
                              "strategy.sequence_parallel=false, or strategy.pipeline_parallel_size=1.")
        plan = None if tp_plan is None else dict(tp_plan)
        super().__init__(*args, dims=DimsSettings(pipeline=pipeline_parallel_size, data_parallel=data_parallel_size,
                                                  tensor=tensor_parallel_size, shard=shard_size),
                         pipeline=pipeline, tensor=TensorParallelSettings(plan, sequence_parallel), **kwargs)
        self.tensor_parallel_size = tensor_parallel_size
        self.pipeline_parallel_size = pipeline_parallel_size
