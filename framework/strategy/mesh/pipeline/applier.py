"""The pipeline applier: the model cut into stages on the meta device (this rank's kept); its
schedule (framework/strategy/mesh/schedule.py's other side of the surface) materialises the tensors
stage by stage, runs each micro-batch's passes, sums the norm over the stages and gathers the
checkpoint state over them (framework/strategy/mesh/pipeline/run.py does the work)."""
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
from framework.strategy.mesh.schedule import Schedule


class PipelineApplier(Applier):
    """Pipeline stages over the mesh's outermost dimension."""

    norm_by_hand = True
    state_by_hand = True
    mesh_dims = ("pipeline",)
    # the schedule runs one loss's backward through its stages, calling backward itself on the loss
    # it computed; a stage passes its activations alone to the next; state gathered whole (names
    # stable across stage counts)
    abilities = Abilities(pipeline_stages=True, collective_forward=True, manual_optimization=False, loss_scaling=False,
                          position_ids=False, sharded_state=False,
                          single_optimizer_reason="runs one loss's backward through its stages inside its schedule")

    def __init__(self, placement, dims):
        super().__init__(placement, dims)
        self.settings = placement.pipeline
        self.run: PipelineRun | None = None
        self._schedule: PipelineSchedule | None = None  # made with the stages (build)

    @classmethod
    def wanted(cls, placement, dims) -> bool:
        return placement.pipeline is not None

    def problems(self, model):
        return self.settings.problems(self.dims.pipeline, self.placement.loop_settings.micro_batch_size, model)

    def lines(self, model):
        return layout_lines(self.settings, self.dims, model, self.placement.loop_settings.micro_batch_size)

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
        s = self.placement
        self.run = PipelineRun(self.settings, self.dims, s.global_rank, s.root_device, s.name)
        part = self.run.split(model)
        s.say(f"{s.name}: {describe_pipeline(self.settings, self.dims)}; layers per stage {self.run.layers}")
        self._schedule = PipelineSchedule(self.run, self.placement)
        return part

    def schedule(self):
        return self._schedule

    def no_sync(self, model, skip):
        return nullcontext()  # torch's PipelineStage defers the reduction to the schedule's last microbatch

    def before_clip(self, model) -> None:
        self.run.tie_gradients(model)


class PipelineSchedule(Schedule):
    """The pipeline's side of the surface (framework/strategy/mesh/schedule.py): every micro-batch's
    passes through the stages, the stages as FSDP2's roots, tensors allocated stage by stage, the
    norm over the stages without the tied head's copy, the state gathered over the stages."""

    def __init__(self, run: PipelineRun, placement):
        self.run, self.placement = run, placement

    def roots(self, model):
        return list(model.stages.values())

    def materialise(self, model, log, device) -> None:
        PipelineRun.materialise(model, log, device)

    def attach(self, model) -> None:
        self.run.attach(model, self.placement.mesh)

    def forward_backward(self, model, task, batch, group, scale, loss_of):
        return self.run.forward_backward(model, task, batch, group, scale, self.placement.forward_context, loss_of)

    def counted(self, model):
        return self.run.counted(model)

    @property
    def norm_group(self):
        return self.run.group

    def merged_model_state(self, own):
        return self.run.merged_model_state(own, self.placement.world_size)

    def merged_optimizer_state(self, own):
        return self.run.merged_optimizer_state(own, self.placement.world_size)

    def load_model_state(self, model, full) -> None:
        mine, strict = self.run.own_model_state(model, full, self.placement.world_size)
        state.load_whole_model_state(model, mine, strict)

    def optimizer_state_to_load(self, model, full):
        return state.pipeline_optimizer_state(model, full)
