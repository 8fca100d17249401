"""`strategy=model_parallel`: FSDP2 over data-parallel ranks x tensor parallelism on a 2-D mesh
(framework/strategy/fsdp_tensor_parallel.py), and with `pipeline_parallel_size` > 1 a third
dimension, pipeline stages outermost on a (pipeline, data_parallel, tensor_parallel) mesh: then the
option builds strategy=pipeline's strategy (framework/strategy/pipeline.py) from its own keys, so
one option spells every mesh from 1-D to 3-D, as torchtitan's parallelism settings do.
"""
from __future__ import annotations

from typing import Literal

from framework.config.types import PositiveInt
from framework.errors import ConfigError
from framework.strategy.fsdp_tensor_parallel import FSDPTensorParallelStrategy
from framework.strategy.pipeline import PipelineStrategy

#: the pipeline's keys and their defaults here (conf/strategy/model_parallel.yaml); they act only
#: with pipeline_parallel_size > 1
PIPELINE_KEYS = {"schedule": "1f1b", "microbatches": "auto", "stages_per_rank": 1, "layers_per_stage": None}


def _pipelined(pipeline_parallel_size: int, args: tuple, kwargs: dict) -> PipelineStrategy:
    """strategy=pipeline's strategy from this option's keys (its tensor_parallel_size 'auto' kept:
    the devices of one node that the pipeline's ranks leave, framework/strategy/pipeline.py)."""
    if kwargs.pop("sequence_parallel", False):
        raise ConfigError(f"strategy.sequence_parallel=true with strategy.pipeline_parallel_size={pipeline_parallel_size}: "
                          "pipeline stages pass whole activations between them, not a sequence split over the "
                          "tensor-parallel ranks; set strategy.sequence_parallel=false, or "
                          "strategy.pipeline_parallel_size=1.")
    kwargs.setdefault("tensor_parallel_size", "auto")  # this option's default, not strategy=pipeline's
    return PipelineStrategy(*args, pipeline_parallel_size=pipeline_parallel_size, **kwargs)


class ModelParallelStrategy(FSDPTensorParallelStrategy):
    """FSDP2 x tensor parallelism (Lightning's ModelParallelStrategy, torchtitan's FSDP x TP); with
    `pipeline_parallel_size` > 1, building it gives the PipelineStrategy of the same keys instead."""

    def __new__(cls, *args, pipeline_parallel_size: int = 1, **kwargs):
        if cls is ModelParallelStrategy and pipeline_parallel_size != 1:
            return _pipelined(pipeline_parallel_size, args, kwargs)  # not an instance: __init__ is not run on it
        return super().__new__(cls)

    def __init__(self, *args, pipeline_parallel_size: PositiveInt = 1, schedule: str = "1f1b",
                 microbatches: PositiveInt | Literal["auto"] = "auto", stages_per_rank: PositiveInt = 1,
                 layers_per_stage: list[int] | None = None, **kwargs):
        """pipeline_parallel_size: ranks a batch passes through, one stage group each (1: no
        pipeline, the 2-D mesh); schedule, microbatches, stages_per_rank, layers_per_stage: the
        pipeline's (conf/strategy/pipeline.yaml says what each does), only with
        pipeline_parallel_size > 1. The other keys: framework/strategy/fsdp_tensor_parallel.py."""
        given = {"schedule": schedule, "microbatches": microbatches, "stages_per_rank": stages_per_rank,
                 "layers_per_stage": layers_per_stage}
        for key, value in given.items():
            if value != PIPELINE_KEYS[key]:
                raise ConfigError(f"strategy.{key}={value} sets the pipeline, but strategy.pipeline_parallel_size is 1 "
                                  "(no stages); set strategy.pipeline_parallel_size to the number of pipeline ranks, "
                                  f"or drop strategy.{key}.")
        super().__init__(*args, **kwargs)
