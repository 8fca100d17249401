"""The pipeline applier: the model cut into stages on the meta device (this rank's kept), its
tensors materialised stage by stage, each micro-batch's passes run by the schedule, the norm summed
over the stages and the checkpoint state gathered over them (framework/strategy/mesh/pipeline/run.py
does the work)."""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace

from framework.strategy.abilities import Abilities
from framework.strategy.layout import Layout, StateLayout
from framework.strategy.mesh import state
from framework.strategy.mesh.applier import Applier
from framework.strategy.mesh.pipeline.plan import (
    describe_pipeline,
    first_stage_activations,
    layout_lines,
    rank_parameters,
)
from framework.strategy.mesh.pipeline.run import PipelineRun


class PipelineApplier(Applier):
    """Pipeline stages over the mesh's outermost dimension."""

    norm_by_hand = True
    state_by_hand = True
    mesh_dims = ("pipeline",)
    # the schedule runs one loss's backward through its stages, calling backward itself on the loss
    # it computed; a stage passes its activations alone to the next; state gathered whole (names
    # stable across stage counts)
    abilities = Abilities(pipeline_stages=True, manual_optimization=False, loss_scaling=False, position_ids=False,
                          sharded_state=False,
                          single_optimizer_reason="runs one loss's backward through its stages inside its schedule")

    def __init__(self, strategy, dims):
        super().__init__(strategy, dims)
        self.settings = strategy.pipeline
        self.run: PipelineRun | None = None

    @classmethod
    def wanted(cls, strategy, dims) -> bool:
        return strategy.pipeline is not None

    def problems(self, model):
        return self.settings.problems(self.dims.pipeline, self.strategy.loop_settings.micro_batch_size, model)

    def lines(self, model):
        return layout_lines(self.settings, self.dims, model, self.strategy.loop_settings.micro_batch_size)

    def layout(self, layout: Layout, model) -> Layout:
        layout = replace(layout, states=StateLayout("pipelined", data_parallel=self.dims.shard,
                                                    tensor_parallel=self.dims.tensor))
        if model is None:
            return layout
        # the most loaded pipeline rank's parameters; the first stage's activations at once
        return replace(layout, held_parameters=max(rank_parameters(self.settings, self.dims, model)),
                       activation_share=layout.activation_share * first_stage_activations(self.settings, self.dims,
                                                                                           model))

    def build(self, model):
        s = self.strategy
        self.run = PipelineRun(self.settings, self.dims, s.global_rank, s.root_device, s.name)
        part = self.run.split(model)
        s._say(f"{s.name}: {describe_pipeline(self.settings, self.dims)}; layers per stage {self.run.layers}")
        return part

    def roots(self, model):
        return list(model.stages.values())

    def materialise(self, model, log, device) -> bool:
        PipelineRun.materialise(model, log, device)
        return True

    def finish(self, model) -> None:
        self.run.attach(model, self.strategy.mesh)

    # ---- a step ----------------------------------------------------------------------------------
    def forward_backward(self, model, task, batch, group, scale, loss_of):
        return self.run.forward_backward(model, task, batch, group, scale, self.strategy.forward_context, loss_of)

    def no_sync(self, model, skip):
        return nullcontext()  # torch's PipelineStage defers the reduction to the schedule's last microbatch

    def before_clip(self, model) -> None:
        self.run.tie_gradients(model)

    def counted(self, model):
        return self.run.counted(model)

    @property
    def norm_group(self):
        return self.run.group

    # ---- checkpoints -----------------------------------------------------------------------------
    def merge_model_state(self, own):
        return self.run.merged_model_state(own, self.strategy.world_size)

    def merge_optimizer_state(self, own):
        return self.run.merged_optimizer_state(own, self.strategy.world_size)

    def load_model_state(self, model, full) -> bool:
        mine, strict = self.run.own_model_state(model, full, self.strategy.world_size)
        state.load_whole_model_state(model, mine, strict)
        return True

    def optimizer_state_to_load(self, model, full):
        return state.pipeline_optimizer_state(model, full)
