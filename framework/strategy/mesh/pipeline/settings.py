"""A pipeline's settings (strategy.schedule, microbatches, stages_per_rank, layers_per_stage) and
what follows from them at a given pipeline size: the stage count, the microbatches, which stages
each rank holds, and what stops them from running."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

import torch

from framework.construction.stage_modules import model_split
from framework.errors import ConfigError
from framework.strategy.mesh.pipeline.schedules import SCHEDULES, schedule_problems, stage_ids, stages_per_rank


@dataclass(frozen=True)
class PipelineSettings:
    """schedule: a row of pipeline/schedules.py; microbatches: pieces each rank's batch is cut into
    ('auto': the stage count); stages_per_rank: stages a rank holds under the looped schedules (the V
    schedules: 2, the others 1); layers_per_stage: consecutive layers each stage holds (None:
    balanced by parameters)."""

    schedule: str = "1f1b"
    microbatches: Union[int, Literal["auto"]] = "auto"
    stages_per_rank: int = 1
    layers_per_stage: tuple | None = None

    @property
    def per_rank(self) -> int:
        return stages_per_rank(self.schedule, self.stages_per_rank) if self.schedule in SCHEDULES else 1

    def stage_count(self, pipeline_size: int) -> int:
        return pipeline_size * self.per_rank

    def microbatch_count(self, pipeline_size: int) -> int:
        return self.stage_count(pipeline_size) if self.microbatches == "auto" else int(self.microbatches)

    def stages_of(self, pipeline_rank: int, pipeline_size: int) -> list[int]:
        """The stages pipeline rank `pipeline_rank` holds."""
        return stage_ids(self.schedule, pipeline_rank, pipeline_size, self.per_rank)

    def split(self, model: torch.nn.Module, pipeline_size: int):
        """The model's layers cut into this pipeline's stages (ranges of layer indices)."""
        return model_split(model, self.stage_count(pipeline_size),
                           None if self.layers_per_stage is None else list(self.layers_per_stage))

    def problems(self, pipeline_size: int, micro_batch_size: int, model: torch.nn.Module | None) -> list[str]:
        """What stops this pipeline at `pipeline_size` ranks (each naming the key and the fix)."""
        found = schedule_problems(self.schedule, pipeline_size, self.stages_per_rank,
                                  self.microbatch_count(pipeline_size), micro_batch_size)
        if found or model is None:
            return found
        try:
            self.split(model, pipeline_size)
        except ConfigError as err:
            return [str(err)]
        return []
