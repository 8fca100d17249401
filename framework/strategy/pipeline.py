"""`strategy=pipeline`: pipeline stages x FSDP2 (x tensor parallelism), on torch.distributed.pipelining.

The ranks form a (pipeline, data_parallel, tensor_parallel) mesh, the pipeline outermost. Each pipeline rank holds
one or more contiguous stages of the model's layers (framework/construction/stages.py: balanced by
parameters, or `layers_per_stage`); a step's batch goes through them in `microbatches` pieces in
the order a torch schedule sets (framework/strategy/pipelining/schedules.py). Across the
data-parallel ranks each stage is sharded by FSDP2 and each group reads its own batches; with
`tensor_parallel_size` > 1 each stage's layers are also split over a tensor-parallel group as
strategy=model_parallel splits them (its plan, its checkpoint gathers and its gradient norm are
reused). Built on the meta device: a rank materialises only its stages' layers (its shards).

The numbers do not depend on the pipeline: a microbatch's loss is its summed loss times the step's
scale (the loop's, from the step's scored items on every rank), so the gradients are the
unpipelined step's; a tied head on the last stage is a copy of the first stage's embedding whose
gradient is added to the embedding's before clipping, so the two stay equal; the gradient norm is
taken over every stage. A checkpoint holds the whole model under its own names, so it resumes at
any stage count and under any strategy.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Literal

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from framework.config.types import PositiveInt
from framework.construction import tensor_parallel
from framework.construction.meta_init import replay
from framework.construction.named_state import strict_load
from framework.construction.stage_modules import RankPart, model_split, model_stages
from framework.construction.tied import retie, tied_parameters
from framework.errors import ConfigError
from framework.strategy.base import DataParallel, copy_structure
from framework.strategy.fsdp_tensor_parallel import FSDPTensorParallelStrategy, global_norm, whole_tensor
from framework.strategy.pipelining import forward
from framework.strategy.pipelining.mesh import mesh_sizes
from framework.strategy.pipelining.plan import first_stage_activations, layout_lines, rank_parameters
from framework.strategy.pipelining.schedules import (
    SCHEDULES,
    schedule_problems,
    stage_ids,
    stages_per_rank,
)
from framework.strategy.pipelining.state import (
    loading_error,
    merge_model_states,
    merge_optimizer_states,
    optimizer_state_for,
    without_copies,
)
from framework.strategy.pipelining.tied import sum_tied_gradients, tied_group
from framework.tensors import write_part

MESH_DIMS = ("pipeline", "data_parallel", "tensor_parallel")


class PipelineStrategy(FSDPTensorParallelStrategy):
    """Pipeline stages over `pipeline_parallel_size` ranks x FSDP2 over the data-parallel ranks x
    tensor parallelism within each stage (torchtitan's PP x FSDP x TP; tensor_parallel_size 1 by
    default). The loop talks to it as to fsdp, except that each micro-batch's forward and backward
    run in the schedule (`forward_backward`)."""

    name = "pipeline"
    supports_manual_optimization = False
    single_optimizer_reason = "runs one loss's backward through its stages inside its schedule"
    supports_loss_scaling = False  # the schedule calls backward itself, on the loss it computed
    passes_position_ids = False  # a stage passes its activations alone to the next
    supports_sharded_state = False  # each stage's state gathered whole (names stable across stage counts)

    def __init__(self, *args, pipeline_parallel_size: PositiveInt | Literal["auto"] = "auto",
                 schedule: str = "1f1b", microbatches: PositiveInt | Literal["auto"] = "auto",
                 stages_per_rank: PositiveInt = 1, layers_per_stage: list[int] | None = None,
                 tensor_parallel_size: PositiveInt | Literal["auto"] = 1,
                 data_parallel_size: PositiveInt | Literal["auto"] = "auto", tp_plan: dict[str, str] | None = None,
                 **kwargs):
        """pipeline_parallel_size: ranks a batch passes through, one stage group each ('auto': every
        rank); schedule: gpipe, 1f1b, interleaved_1f1b, looped_bfs, interleaved_zero_bubble,
        zbv_zero_bubble or dualpipev; microbatches: pieces each rank's batch is cut into ('auto':
        the pipeline's stage count, the least 1F1B takes); stages_per_rank: stages each rank holds
        under the interleaved schedules (the V schedules: 2); layers_per_stage: how many
        consecutive layers each stage holds (null: balanced by parameters); tensor_parallel_size:
        ranks that split each stage's layers (1: none; 'auto': the devices of one node that the ranks
        over pipeline_parallel_size x data_parallel_size allow), by the model's plan or tp_plan (as
        under strategy=model_parallel); data_parallel_size: groups that read different batches
        ('auto': the ranks the other two leave). The fsdp keys apply to the data-parallel sharding
        of each stage."""
        super().__init__(*args, tensor_parallel_size=tensor_parallel_size, data_parallel_size=data_parallel_size,
                         sequence_parallel=False, tp_plan=tp_plan, **kwargs)
        self.pipeline_parallel_size = pipeline_parallel_size
        self.schedule = schedule
        self.microbatches_setting = microbatches
        self.stages_per_rank_setting = stages_per_rank
        self.layers_per_stage = None if layers_per_stage is None else list(layers_per_stage)
        self._mesh = None
        self._schedules: dict = {}
        self._tied_group = None
        self._task = None
        self._weight = 1.0
        self._part: RankPart | None = None
        self._model_names: set[str] = set()  # the whole model's state-dict names (a checkpoint's, loaded)
        self._tied_across = False  # a tied head on another stage than its embedding (a copy there)
        self._tied_names: tuple[str, str] | None = None  # (the embedding's name, the head's)
        self._plan: tuple[dict[str, str], str] = ({}, "")  # the tensor-parallel plan, from the whole model

    # ---- the mesh -------------------------------------------------------------------------
    def mesh_shape(self, world_size: int) -> tuple[int, int, int]:
        """(pipeline, data-parallel, tensor-parallel sizes) for `world_size` ranks, 'auto' resolved."""
        return mesh_sizes(world_size, self.devices, self.pipeline_parallel_size, self.data_parallel_size_setting,
                          self.tensor_parallel_size)

    @property
    def splits_layers(self) -> bool:
        """Tensor parallelism within the stages (the compatibility table reads it: adapters)."""
        try:
            return self.mesh_shape(self._planned_world())[2] > 1
        except ConfigError:  # reported by problems()
            return self.tensor_parallel_size not in (1, "auto")

    @property
    def per_rank(self) -> int:
        return stages_per_rank(self.schedule, self.stages_per_rank_setting) if self.schedule in SCHEDULES else 1

    def stage_count(self, world_size: int) -> int:
        return self.mesh_shape(world_size)[0] * self.per_rank

    def microbatches(self, world_size: int) -> int:
        return (self.stage_count(world_size) if self.microbatches_setting == "auto"
                else int(self.microbatches_setting))

    @property
    def mesh(self):
        """The (pipeline, data_parallel, tensor_parallel) DeviceMesh, made on first use in a worker."""
        if self._mesh is None:
            self._mesh = init_device_mesh(self.root_device.type, self.mesh_shape(self.world_size),
                                          mesh_dim_names=MESH_DIMS)
        return self._mesh

    @property
    def _inner(self) -> int:
        """This rank's place within its pipeline rank's (data_parallel x tensor_parallel) block."""
        pp, dp, tp = self.mesh_shape(self.world_size)
        return self.global_rank % (dp * tp)

    @property
    def pipeline_rank(self) -> int:
        pp, dp, tp = self.mesh_shape(self.world_size)
        return self.global_rank // (dp * tp)

    @property
    def data_parallel(self) -> DataParallel:
        """Each data-parallel group's share; the ranks of one pipeline (and of a tensor-parallel
        group) read the same batches, and the first of them reports their scores."""
        pp, dp, tp = self.mesh_shape(self.world_size)
        return DataParallel(dp, self._inner // tp, self.global_rank < dp * tp and self._inner % tp == 0)

    def _owners(self) -> list[int]:
        """The global rank holding each stage, at this rank's data- and tensor-parallel place."""
        pp, dp, tp = self.mesh_shape(self.world_size)
        owners = [0] * self.stage_count(self.world_size)
        for rank in range(pp):
            for stage in stage_ids(self.schedule, rank, pp, self.per_rank):
                owners[stage] = rank * dp * tp + self._inner
        return owners

    # ---- before launch -------------------------------------------------------------------
    def _planned_world(self) -> int:
        return self.devices * self.num_nodes

    def problems(self, model: torch.nn.Module | None) -> list[str]:
        world = self._planned_world()
        try:
            pp, _, tp = self.mesh_shape(world)
        except ConfigError as err:
            return [str(err)]
        found = schedule_problems(self.schedule, pp, self.stages_per_rank_setting, self.microbatches(world),
                                  self.loop_settings.micro_batch_size)
        if found or model is None:
            return found
        try:
            model_split(model, self.stage_count(world), self.layers_per_stage)
            self.units(model)  # a wrap_modules name the model does not have
        except ConfigError as err:
            return [str(err)]
        if tp == 1:
            return []
        plan, source = self.plan(model)
        return tensor_parallel.plan_problems(model, plan, source or "strategy.tp_plan", tp, False)

    def describe_mesh(self, world_size: int) -> str:
        pp, dp, tp = self.mesh_shape(world_size)
        return (f"{pp} pipeline x {dp} data-parallel" + (f" x {tp} tensor-parallel" if tp > 1 else "")
                + f" ranks, {self.stage_count(world_size)} stages, schedule {self.schedule}, "
                f"{self.microbatches(world_size)} microbatches")

    def describe_layout(self, world_size: int, model) -> list[str]:
        """`framework plan`: the mesh, each stage's layers and parameters, the schedule's bubble and
        the microbatches whose activations the first stage keeps at once."""
        return layout_lines(self, world_size, model)

    memory_layout = "pipelined"  # framework/planning/memory.py: the most loaded pipeline rank's states

    def held_parameters(self, model) -> int:
        """`framework plan`: the parameters the most loaded pipeline rank holds (a tied head's copy counted)."""
        return max(rank_parameters(self, self._planned_world(), model))

    def activation_share(self, model) -> float:
        """`framework plan`: the first stage's activations at once, as a share of one micro-batch's
        through the whole model (its layers' share x the microbatches it keeps / their count)."""
        return first_stage_activations(self, self._planned_world(), model)

    # ---- building: the whole model on meta, this rank's stages materialised -----------------
    def build_model(self, factory, adapter=None):
        """The whole model as fsdp builds it (on the meta device, its initialisation recorded), cut
        into stages; this rank keeps its own (materialised in `wrap_model`)."""
        whole = super().build_model(factory, adapter)
        count = self.stage_count(self.world_size)
        split = model_split(whole, count, self.layers_per_stage)
        pp = self.mesh_shape(self.world_size)[0]
        mine = stage_ids(self.schedule, self.pipeline_rank, pp, self.per_rank)
        stages = model_stages(whole, split)
        self._model_names = set(whole.state_dict())
        self._plan = self.plan(whole)  # the whole model's (its class names the source)
        self._tied_across = any(getattr(stage, "tied_copy", False) for stage in stages)
        self._tied_names = stages[0].tied_names if self._tied_across else None
        self._say(f"{self.name}: {self.describe_mesh(self.world_size)}; layers per stage "
                  + ", ".join(f"{r.start}-{r.stop - 1}" for r in split))
        return RankPart(whole, {i: stages[i] for i in mine}, count)

    def wrap_model(self, part: RankPart) -> RankPart:
        from torch.distributed.fsdp import fully_shard

        _, dp, tp = self.mesh_shape(self.world_size)
        if tp > 1:  # the stages' layers split first, as model_parallel splits them, then FSDP2 over the rest
            plan, source = self._plan
            split = tensor_parallel.parallelize(part, self.mesh["tensor_parallel"], plan, False)
            self._say(f"{self.name}: {len(split)} modules of this rank's stages split by {source}")
        if dp > 1:  # each stage is a root of its own: the schedule calls the stages, not the part
            kwargs = self._shard_kwargs()
            units = self.units(part)
            for stage in part.stages.values():
                for unit in units.modules:
                    if any(unit is m for m in stage.modules()):
                        fully_shard(unit, **kwargs)
                fully_shard(stage, **kwargs)
        if self._init_log is not None:
            self._materialise(part)
        part.forward_fn = self._forward_only
        self._part = part
        self._tied_group = self._make_tied_group()
        return part

    def _materialise(self, part: RankPart) -> None:
        """This rank's tensors (shards) filled with the recorded initialisation; a tied head's copy
        from its embedding's values."""
        log, self._init_log = self._init_log, None
        tied = tied_parameters(part)  # to_empty gives each name a tensor of its own
        part.to_empty(device="cpu" if self.cpu_offload else self.root_device)
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

    def _make_tied_group(self):
        """This rank's group of a pipeline's first and last stage ranks (a tied head), or None."""
        if not self._tied_across:
            return None
        pp, dp, tp = self.mesh_shape(self.world_size)
        return tied_group(self._owners(), pp, dp * tp, self.global_rank)

    # ---- training: a schedule per batch shape ---------------------------------------------
    def _loss(self, outputs, targets) -> torch.Tensor:
        return self._task.summed_loss(outputs, targets) * self._weight

    def _schedule_for(self, part: RankPart, inputs: torch.Tensor):
        key = (tuple(inputs.shape), inputs.dtype)
        if key not in self._schedules:
            import torch.distributed.pipelining as pipelining

            group = self.mesh["pipeline"].get_group()
            count = self.stage_count(self.world_size)
            stages = [pipelining.PipelineStage(module, index, count, self.root_device, group=group)
                      for index, module in sorted(part.stages.items())]
            schedule_class = getattr(pipelining, SCHEDULES[self.schedule].torch_class)
            self._schedules[key] = schedule_class(stages[0] if len(stages) == 1 else stages,
                                                  n_microbatches=self.microbatches(self.world_size),
                                                  loss_fn=self._loss, scale_grads=False)
        return self._schedules[key]

    def forward_backward(self, model: RankPart, task, batch, group, scale, loss_of):
        split = getattr(task, "pipeline_split", None)
        if split is None or getattr(task, "summed_loss", None) is None:
            raise ConfigError(f"strategy=pipeline: task {type(task).__name__} does not say how a batch goes through "
                              "stages; give it pipeline_split(batch) -> (the first stage's input, the targets) and "
                              "summed_loss(outputs, targets) (framework/tasks/base.py), or use another strategy.")
        inputs, targets = split(batch)
        m = self.microbatches(self.world_size)
        if inputs.shape[0] % m:
            raise ConfigError(f"strategy=pipeline: a batch of {inputs.shape[0]} samples does not split into "
                              f"strategy.microbatches={m}; make data.batch_size a multiple of it and set "
                              "data.drop_last=true (a short last batch cannot be cut alike).")
        self._task = task
        # the loop's scale (a normalised task), else a mean over the micro-batch's samples and the group
        self._weight = scale if scale is not None else 1.0 / (inputs.shape[0] * group)
        schedule = self._schedule_for(model, inputs)
        losses: list = []
        kwargs = {"target": targets, "losses": losses} if model.holds_last else {}
        with self.forward_context():
            schedule.step(*((inputs,) if model.holds_first else ()), return_outputs=False, **kwargs)
        zero = torch.zeros((), device=self.root_device)
        total = torch.stack([loss.detach().float() for loss in losses]).sum() if losses else zero
        # logged: only the last stage's ranks hold the loss; weighted by the pipeline size so that the
        # loop's mean over every rank is the mean over the data-parallel groups
        return total, total * group * self.mesh_shape(self.world_size)[0]

    def no_backward_sync(self, model, skip: bool):
        """torch's PipelineStage defers FSDP's gradient reduction to the schedule's last microbatch
        itself; a loop micro-batch is one schedule step."""
        return nullcontext()

    # ---- gradients: the tied head's copy, the norm over every stage ---------------------------
    def clip_gradients(self, model, optimizer, max_norm=None, max_value=None, parameters=None):
        """The tied head's gradient summed with its embedding's first; the norm over every stage
        (each parameter counted once: a tied copy not twice)."""
        part = model
        if self._tied_across:
            sum_tied_gradients(part, self._tied_names, self._tied_group)
        if max_norm is None and max_value is None:
            return None
        named = [(n, p) for n, p in part.named_parameters() if p.grad is not None]
        if max_value is not None:
            self.precision.clip_gradients([p for _, p in named], optimizer, None, max_value)
        else:
            self.precision.unscale_gradients(optimizer)
        if max_norm is None:
            return None
        # the tied head's copy holds the embedding's gradient (summed above): counted once, there
        skip = {self._tied_names[1]} if self._tied_across and part.holds_last else set()
        # over this stage's data- and tensor-parallel splits (model_parallel's), then over the stages
        total = global_norm([p.grad for name, p in named if name not in skip], self.root_device)
        if self.mesh_shape(self.world_size)[0] > 1:
            squares = total.pow(2)
            dist.all_reduce(squares, group=self.mesh["pipeline"].get_group())
            total = squares.sqrt()
        by_mesh: dict = {}
        for _, p in named:
            by_mesh.setdefault(getattr(p.grad, "device_mesh", None), []).append(p)
        for group in by_mesh.values():
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
        return total

    # ---- evaluation: the whole model's forward across the ranks -------------------------------
    def _forward_only(self, input_ids, attention_mask=None, position_ids=None):
        """The whole model's output for `input_ids` on every rank of this pipeline (a GPT ignores
        attention_mask: padding ends a row, and attention is causal)."""
        if position_ids is not None:
            raise ConfigError("strategy=pipeline: packed rows (position_ids) do not pass between stages; set "
                              "data.packing=false, or use strategy=fsdp.")
        return forward.forward_across(self._part.stages, self._owners(), self.global_rank, input_ids,
                                      self.mesh["pipeline"].get_group(), self.root_device)

    # ---- checkpoints: each rank's stages, together the whole model under its own names ----------
    def _pipeline_gather(self, own: dict) -> list | dict:
        """Collective: every pipeline rank's `own` (its first data- and tensor-parallel rank's: the
        others hold the same) as a list on rank zero; {} elsewhere. One process: `own`."""
        if self.world_size == 1:
            return own
        parts = [None] * self.world_size if self.is_global_zero else None
        dist.gather_object(own if self._inner == 0 else None, parts, dst=0)
        return parts if self.is_global_zero else {}

    def model_state_dict(self, model: RankPart) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        own = get_model_state_dict(model, options=StateDictOptions(full_state_dict=False))
        own = {name: whole_tensor(value) for name, value in own.items()}  # collective over the stage's ranks
        gathered = self._pipeline_gather(own)
        return merge_model_states(gathered, self._tied_names) if isinstance(gathered, list) else gathered

    def optimizer_state_dict(self, model: RankPart, optimizer) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        own = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=False))
        own = {"state": {name: {key: whole_tensor(value) for key, value in entry.items()}
                         for name, entry in own["state"].items()},
               "param_groups": own["param_groups"]}
        gathered = self._pipeline_gather(without_copies(own, set(model.tied_copies().values())))
        return merge_optimizer_states(gathered) if isinstance(gathered, list) else gathered

    def load_model_state_dict(self, model: RankPart, state: dict) -> None:
        own = dict(model.state_dict())
        strict = strict_load(model, state)  # an adapter's checkpoint: its trainable weights alone
        missing = sorted(set(own) - set(state)) if strict else []
        if self.world_size > 1:  # every rank stops alike, whichever stages lack their layers
            everyone: list = [None] * self.world_size
            dist.all_gather_object(everyone, missing)
            missing = sorted({name for names in everyone for name in names})
        unexpected = sorted(set(state) - self._model_names)
        if missing or unexpected:
            raise RuntimeError(loading_error(missing, unexpected))
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        mine = {name: state[name] for name in own if name in state}
        set_model_state_dict(model, copy_structure(mine), options=StateDictOptions(full_state_dict=True, strict=strict))
        for name, entry in self._fused_state(model).items():  # model_parallel's fused layers, placed by hand
            if name in mine:
                write_part(mine[name], entry["param"])

    def load_optimizer_state_dict(self, model: RankPart, optimizer, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        mine = optimizer_state_for(state, {name for name, _ in model.named_parameters()}, model.tied_copies())
        set_optimizer_state_dict(model, optimizer, copy_structure(mine),
                                 options=StateDictOptions(full_state_dict=True))
        for name, entry in self._fused_state(model, optimizer).items():
            for key, tensor in entry.items():
                if key != "param" and key in mine["state"].get(name, {}):
                    write_part(mine["state"][name][key], tensor)

