"""One worker's pipeline: the stages this rank holds, the schedule per batch shape, the tied head
across stages, the whole model's forward for evaluation, and the checkpoint state gathered over
the pipeline's ranks. The mesh strategy (framework/strategy/mesh/strategy.py) builds one when its
layout has pipeline stages and hands it the model at each step.

The numbers do not depend on the pipeline: a microbatch's loss is its summed loss times the step's
scale (the loop's, from the step's scored items on every rank), so the gradients are the
unpipelined step's (a mixture of experts' own losses join each stage's backward with the same
weight: framework/models/stage_routing.py); a tied head on the last stage is a copy of the first stage's embedding whose
gradient is added to the embedding's before clipping, so the two stay equal; the gradient norm is
taken over every stage. A checkpoint holds the whole model under its own names, so it resumes at
any stage count and under any strategy."""
from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist

from framework.batch_split import refuse_positions_in_stages
from framework.construction.meta_init import InitLog, replay
from framework.construction.named_state import strict_load
from framework.construction.routing import Routed
from framework.construction.stage_modules import RankPart, model_stages
from framework.construction.tied import retie, tied_parameters
from framework.errors import ConfigError, indivisible, refuse
from framework.strategy.mesh.dims import ParallelDims
from framework.strategy.mesh.experts import routing_counted
from framework.strategy.mesh.pipeline import forward
from framework.strategy.mesh.pipeline.schedules import SCHEDULES
from framework.strategy.mesh.pipeline.settings import PipelineSettings
from framework.strategy.mesh.pipeline.state import (
    loading_error,
    merge_model_states,
    merge_optimizer_states,
    without_copies,
)
from framework.strategy.mesh.pipeline.tied import sum_tied_gradients, tied_group
from framework.tensors import write_part


class PipelineRun:
    """The pipeline of one worker (rank `rank` of a layout `dims`), for the strategy named `name`."""

    def __init__(self, settings: PipelineSettings, dims: ParallelDims, rank: int, device: torch.device, name: str):
        self.settings, self.dims, self.rank, self.device, self.name = settings, dims, rank, device, name
        at = dims.coordinates(rank)
        self.pipeline_rank = at["pipeline"]
        self.inner = rank % (dims.world_size // dims.pipeline)  # place within its pipeline rank's block
        self.stage_count = settings.stage_count(dims.pipeline)
        self.microbatches = settings.microbatch_count(dims.pipeline)
        self.part: RankPart | None = None
        self.group = None  # the pipeline's process group, from the mesh
        self.model_names: set[str] = set()  # the whole model's state-dict names (a checkpoint's, loaded)
        self.tied_names: tuple[str, str] | None = None  # (embedding, head) where the head is on another stage
        self.layers = ""  # each stage's layers, as `split` said them ("0-3, 4-7")
        self._tied_group = None
        self._schedules: dict = {}
        self._task = None
        self._weight = 1.0
        self._values: list[dict] = []  # what the microbatches' summed_loss returned beside the loss
        self._value_names: list[str] | None = None
        self._routed = False  # the model routes tokens to experts (a mixture of experts): its values are logged
        self._routing = None  # the task's watch over this rank's stages' routing (Task.stage_routing)

    def owners(self) -> list[int]:
        """The global rank holding each stage, at this rank's data- and tensor-parallel place."""
        block = self.dims.world_size // self.dims.pipeline
        owners = [0] * self.stage_count
        for rank in range(self.dims.pipeline):
            for stage in self.settings.stages_of(rank, self.dims.pipeline):
                owners[stage] = rank * block + self.inner
        return owners

    # ---- building ------------------------------------------------------------------------
    def split(self, whole: torch.nn.Module) -> RankPart:
        """The whole model (on the meta device) cut into stages; this rank's as one module."""
        ranges = self.settings.split(whole, self.dims.pipeline)
        stages = model_stages(whole, ranges)
        self.model_names = set(whole.state_dict())
        self._routed = any(isinstance(m, Routed) for m in whole.modules())
        if any(getattr(stage, "tied_copy", False) for stage in stages):
            self.tied_names = stages[0].tied_names
        self.layers = ", ".join(f"{r.start}-{r.stop - 1}" for r in ranges)
        mine = self.settings.stages_of(self.pipeline_rank, self.dims.pipeline)
        return RankPart(whole, {i: stages[i] for i in mine}, self.stage_count)

    def attach(self, part: RankPart, mesh) -> None:
        """After the appliers: the pipeline's group, evaluation's forward, the tied head's group."""
        self.part, self.group = part, mesh["pipeline"].get_group()
        part.forward_fn = self.forward_only
        if self.tied_names is not None:
            block = self.dims.world_size // self.dims.pipeline
            self._tied_group = tied_group(self.owners(), self.dims.pipeline, block, self.rank)

    @staticmethod
    def materialise(part: RankPart, log: InitLog, device: torch.device) -> None:
        """This rank's tensors (shards) filled with the recorded initialisation; a tied head's copy
        from its embedding's values."""
        tied = tied_parameters(part)  # to_empty gives each name a tensor of its own
        part.to_empty(device=device)
        retie(part, tied)
        own = dict(part.named_parameters(remove_duplicate=False))
        own.update(dict(part.named_buffers()))
        copies = part.tied_copies()

        def write(name: str, full: torch.Tensor) -> None:
            for target_name in (name, copies.get(name)):
                target = own.get(target_name)
                if target is not None:
                    with torch.no_grad():
                        write_part(full.to(target.dtype), target)

        replay(log, write)

    # ---- training: a schedule per batch shape ---------------------------------------------
    def _loss(self, outputs, targets) -> torch.Tensor:
        """A microbatch's loss as the schedule backpropagates it; values a task returns beside it
        (summed_loss returning {"loss": ..., name: value}) kept for the loop's log."""
        returned = self._task.summed_loss(outputs, targets)
        if isinstance(returned, Mapping):
            if "loss" not in returned:
                raise ConfigError(f"task: {type(self._task).__name__}.summed_loss returned a dict without 'loss' (it "
                                  f"has {', '.join(returned) or 'nothing'}); return the summed loss, or a dict with "
                                  "'loss' and other values to log.")
            self._values.append({k: torch.as_tensor(v).detach().float() for k, v in returned.items() if k != "loss"})
            returned = returned["loss"]
        return returned * self._weight

    def _logged_values(self, holds_last: bool, microbatches: int) -> dict[str, torch.Tensor]:
        """The values the last stage's microbatches returned beside their loss, their mean over the
        microbatches, on every rank of the pipeline: weighted by the pipeline size on the last
        stage's ranks and zero elsewhere (so the loop's mean over every rank is their mean over
        the data-parallel groups, as for the loss). Which names: said once by the last stage."""
        if self._value_names is None:
            names = [sorted(self._values[0]) if self._values else []]
            dist.broadcast_object_list(names, src=self.owners()[-1], group=self.group)
            self._value_names = names[0]
        # the step's microbatches' (their last calls: torch's first step also calls the loss once on
        # placeholder outputs, to learn the gradients' shapes, and keeps no loss of it)
        values, self._values = self._values[len(self._values) - microbatches:], []
        if not holds_last:
            return {name: torch.zeros((), device=self.device) for name in self._value_names}
        return {name: torch.stack([v[name] for v in values]).mean().to(self.device) * self.dims.pipeline
                for name in self._value_names}

    def _schedule_for(self, part: RankPart, inputs: torch.Tensor):
        key = (tuple(inputs.shape), inputs.dtype)
        if key not in self._schedules:
            import torch.distributed.pipelining as pipelining

            stages = [pipelining.PipelineStage(module, index, self.stage_count, self.device, group=self.group)
                      for index, module in sorted(part.stages.items())]
            for module in part.stages.values():
                counted_after_inference(module)
            schedule_class = getattr(pipelining, SCHEDULES[self.settings.schedule].torch_class)
            self._schedules[key] = schedule_class(stages[0] if len(stages) == 1 else stages,
                                                  n_microbatches=self.microbatches, loss_fn=self._loss,
                                                  scale_grads=False)
        return self._schedules[key]

    def forward_backward(self, part: RankPart, task, batch, group: int, scale, forward_context, loss_of):
        """Both passes of every microbatch through the schedule; returns (the loss the guard
        watches: this rank's stages' summed loss, the step's share for logging); the values a
        task's summed_loss returns beside the loss go to the loop's log through `loss_of`, on every
        rank alike."""
        inputs, targets = task.pipeline_split(batch)
        m = self.microbatches
        refuse(indivisible(f"strategy={self.name}: strategy.microbatches={m}", m, inputs.shape[0],
                           f"a batch of {inputs.shape[0]} samples", "make data.batch_size a multiple of it and set "
                           "data.drop_last=true (a short last batch cannot be cut alike)."))
        self._task = task
        # the loop's scale (a normalised task), else a mean over the micro-batch's scored items (its
        # samples where the task does not count them) and the group, as a training_step's mean loss
        counted = task.scored_count(batch) if getattr(task, "scored_count", None) is not None else inputs.shape[0]
        self._weight = scale if scale is not None else 1.0 / (max(counted, 1) * group)
        if self._routed and self._routing is None:  # before the first schedule: its hooks see every forward
            self._routing = task.stage_routing(part.stages)
        if self._routing is not None:  # the experts' own losses, in each stage's backward, weighted as the loss
            self._routing.weigh_losses(*((scale, True) if scale is not None else (1.0 / (m * group), False)))
        schedule = self._schedule_for(part, inputs)
        losses: list = []
        kwargs = {"target": targets, "losses": losses} if part.holds_last else {}
        with forward_context():
            schedule.step(*((inputs,) if part.holds_first else ()), return_outputs=False, **kwargs)
        zero = torch.zeros((), device=self.device)
        total = torch.stack([loss.detach().float() for loss in losses]).sum() if losses else zero
        values = self._logged_values(part.holds_last, len(losses))
        if self._routing is not None:  # a mixture of experts' routing values, every stage's layers
            values.update(self._routing.values(m, self.group, self.dims.pipeline, self.device))
        if values:
            loss_of({"loss": total, **values})
        # logged: only the last stage's ranks hold the loss; weighted by the pipeline size so that the
        # loop's mean over every rank is the mean over the data-parallel groups
        return total, total * group * self.dims.pipeline

    def forward_only(self, input_ids, attention_mask=None, position_ids=None):
        """The whole model's output for `input_ids` on every rank of this pipeline (a GPT ignores
        attention_mask: padding ends a row, and attention is causal)."""
        refuse_positions_in_stages(position_ids, self.name)
        return forward.forward_across(self.part.stages, self.owners(), self.rank, input_ids, self.group, self.device)

    # ---- gradients --------------------------------------------------------------------------
    def tie_gradients(self, part: RankPart) -> None:
        """The tied head's gradient summed with its embedding's (both sides hold the sum)."""
        if self.tied_names is not None:
            sum_tied_gradients(part, self.tied_names, self._tied_group)

    def counted(self, part: RankPart) -> list:
        """The parameters the gradient norm counts: a tied head's copy holds its embedding's
        gradient (summed) and is counted once, there."""
        skip = {self.tied_names[1]} if self.tied_names is not None and part.holds_last else set()
        return [p for name, p in part.named_parameters() if name not in skip]

    # ---- checkpoints: each rank's stages, together the whole model under its own names ---------
    def gather(self, own: dict, world_size: int) -> list | dict:
        """Collective: every pipeline rank's `own` (its first data- and tensor-parallel rank's: the
        others hold the same) as a list on rank zero; {} elsewhere. One process: `own`."""
        if world_size == 1:
            return own
        parts = [None] * world_size if self.rank == 0 else None
        dist.gather_object(own if self.inner == 0 else None, parts, dst=0)
        return parts if self.rank == 0 else {}

    def merged_model_state(self, own: dict, world_size: int) -> dict:
        gathered = self.gather(own, world_size)
        return merge_model_states(gathered, self.tied_names) if isinstance(gathered, list) else gathered

    def merged_optimizer_state(self, own: dict, world_size: int) -> dict:
        gathered = self.gather(without_copies(own, set(self.part.tied_copies().values())), world_size)
        return merge_optimizer_states(gathered) if isinstance(gathered, list) else gathered

    def own_model_state(self, part: RankPart, state: dict, world_size: int) -> tuple[dict, bool]:
        """The entries of a whole model's `state` this rank's stages load, and whether strictly;
        every rank stops alike (a RuntimeError in torch's words) if any stage lacks its layers."""
        own = dict(part.state_dict())
        strict = strict_load(part, state)  # an adapter's checkpoint: its trainable weights alone
        missing = sorted(set(own) - set(state)) if strict else []
        if world_size > 1:
            everyone: list = [None] * world_size
            dist.all_gather_object(everyone, missing)
            missing = sorted({name for names in everyone for name in names})
        unexpected = sorted(set(state) - self.model_names)
        if missing or unexpected:
            raise RuntimeError(loading_error(missing, unexpected))
        return {name: state[name] for name in own if name in state}, strict


def counted_after_inference(stage: torch.nn.Module) -> None:
    """A new schedule's first call of each stage is torch's metadata inference (one microbatch, or
    placeholders, with gradients on): its routing is not counted (a mixture of experts' bias
    balancing counts the step's real tokens only)."""
    def pause(module, args):
        routing_counted(module, False)

    def resume(module, args, output):
        routing_counted(module, True)
        handles[0].remove()
        handles[1].remove()

    handles = [stage.register_forward_pre_hook(pause), stage.register_forward_hook(resume)]
