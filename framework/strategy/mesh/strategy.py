"""The FSDP2 family's one strategy: a layout resolved from the parallel-dims spec (dims.py), built
by the appliers in a fixed order (tensor parallelism, the pipeline split, FSDP2 sharding), with
clipping and checkpoint state written once for every layout (gradients.py, state.py). The options
fsdp, fsdp_cpu_offload, hsdp, model_parallel and pipeline are presets of it: each sets the spec
from its own keys and names itself in every message (framework/strategy/<option>.py)."""
from __future__ import annotations

import logging
from contextlib import contextmanager, nullcontext
from dataclasses import replace

import torch

from framework.config.types import PositiveInt
from framework.construction.meta_init import InitLog, build_on_meta
from framework.construction.prepare import with_adapter
from framework.construction.units import DEFAULT_MIN_UNIT_PARAMS, Units, choose_units
from framework.errors import ConfigError
from framework.strategy.base import DataParallel, Layout
from framework.strategy.mesh import experts, state
from framework.strategy.mesh.dims import DimsSettings, ParallelDims
from framework.strategy.mesh.fully_shard import apply_fully_shard, materialise, shard_kwargs
from framework.strategy.mesh.gradients import clip_gradients
from framework.strategy.mesh.pipeline.plan import (
    describe_pipeline,
    first_stage_activations,
    layout_lines,
    rank_parameters,
)
from framework.strategy.mesh.pipeline.run import PipelineRun
from framework.strategy.mesh.pipeline.settings import PipelineSettings
from framework.strategy.mesh.tensor_parallel import TensorParallelSettings, apply_tensor_parallel
from framework.strategy.parallel import ParallelStrategy


class MeshStrategy(ParallelStrategy):
    """Any layout of pipeline x (replicate x shard) x tensor ranks over FSDP2. Built on the meta
    device and materialised shard by shard (a pipeline rank: its stages only). The loop talks to
    it as to any strategy; with pipeline stages each micro-batch's forward and backward run in the
    schedule (`forward_backward`)."""

    name = "fsdp"
    shards_states = True
    requires_torch = "2.6"  # fully_shard (FSDP2) public in torch.distributed.fsdp; the compatibility table reads it

    def __init__(self, *args, dims: DimsSettings = DimsSettings(), pipeline: PipelineSettings | None = None,
                 tensor: TensorParallelSettings = TensorParallelSettings(), wrap_modules: list[str] | None = None,
                 min_unit_params: PositiveInt = DEFAULT_MIN_UNIT_PARAMS, reshard_after_forward: bool = True,
                 cpu_offload: bool = False, meta_init: bool = True, timeout_s: float = 1800.0, **kwargs):
        """dims: the sizes as the option's keys set them; pipeline: the pipeline's settings (None: no
        stages); tensor: the tensor-parallel plan; the rest are the FSDP2 keys
        (conf/strategy/fsdp.yaml says what each does)."""
        super().__init__(*args, timeout_s=timeout_s, **kwargs)
        self.dims_settings, self.pipeline, self.tensor = dims, pipeline, tensor
        self.wrap_modules = None if wrap_modules is None else list(wrap_modules)
        self.min_unit_params = min_unit_params
        self.reshard_after_forward = reshard_after_forward
        self.cpu_offload = cpu_offload
        self.meta_init = meta_init
        self._init_log: InitLog | None = None
        self._mesh = None
        self._run: PipelineRun | None = None
        self._plan: tuple[dict[str, str], str] = ({}, "")  # the tensor-parallel plan, from the whole model
        self._resolved: dict[tuple[int, int], ParallelDims] = {}
        self._experts: experts.ExpertParallel | None = None

    # ---- the layout ---------------------------------------------------------------------------
    def parallel_dims(self, world_size: int) -> ParallelDims:
        """The layout of `world_size` ranks ('auto' resolved); ConfigError naming the keys. Kept per
        (world size, devices): the step's clipping asks for it."""
        key = (world_size, self.devices)
        if key not in self._resolved:
            self._resolved[key] = self.dims_settings.resolve(world_size, self.devices)
        return self._resolved[key]

    @property
    def dims(self) -> ParallelDims:
        return self.parallel_dims(self.world_size)

    def _planned(self) -> ParallelDims:
        return self.parallel_dims(self.devices * self.num_nodes)

    @property
    def mesh(self):
        """The device mesh, made on first use in a worker."""
        if self._mesh is None:
            self._mesh = self.dims.build_mesh(self.root_device.type, ("pipeline", "shard") if self.pipelined else ("shard",))
        return self._mesh

    @property
    def pipelined(self) -> bool:
        return self.pipeline is not None

    @property
    def data_parallel(self) -> DataParallel:
        return self.dims.data_share(self.global_rank)

    @property
    def splits_layers(self) -> bool:
        """Tensor parallelism (the compatibility table reads it: adapters)."""
        try:
            return self._planned().tensor > 1
        except ConfigError:  # reported by problems()
            return self.dims_settings.tensor not in (1, "auto")

    # what a schedule that runs each step's passes itself cannot do (the compatibility table reads these)
    @property
    def supports_manual_optimization(self) -> bool:
        return not self.pipelined

    single_optimizer_reason = "runs one loss's backward through its stages inside its schedule"

    @property
    def supports_loss_scaling(self) -> bool:  # the schedule calls backward itself, on the loss it computed
        return not self.pipelined

    @property
    def passes_position_ids(self) -> bool:  # a stage passes its activations alone to the next
        return not self.pipelined

    @property
    def supports_sharded_state(self) -> bool:  # a pipeline's state gathered whole: names stable across stage counts
        return not self.pipelined

    @property
    def memory_layout(self) -> str:
        return "pipelined" if self.pipelined else "fully_sharded"

    def setup_environment(self) -> None:
        super().setup_environment()
        # DTensor logs a warning on every rank whenever a 2-D parameter is gathered in two steps
        # (a checkpoint, the gradient norm): how a 2-D mesh works, not something a user can act on
        logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)

    # ---- before launch --------------------------------------------------------------------------
    def units(self, model: torch.nn.Module) -> Units:
        """The modules sharded as units (the same rule `framework plan` and `validate` use); under
        expert parallelism a unit gathers its parameters but its experts (spread, never gathered)."""
        units = choose_units(model, self.wrap_modules, self.min_unit_params)
        try:
            spread = self._planned().expert > 1
        except ConfigError:  # reported by problems()
            spread = False
        if not spread:
            return units
        owned = experts.expert_parameters(model)
        inside = [sum(p.numel() for p in unit.parameters() if p in owned) for unit in units.modules]
        return replace(units, gathered=[n - e for n, e in zip(units.gathered, inside + [0])])

    def problems(self, model: torch.nn.Module | None) -> list[str]:
        try:
            dims = self._planned()
        except ConfigError as err:
            return [str(err)]
        found = (self.pipeline.problems(dims.pipeline, self.loop_settings.micro_batch_size, model)
                 if self.pipelined else [])
        if found or model is None:
            return found
        try:
            self.units(model)  # a wrap_modules name the model does not have
        except ConfigError as err:
            return [str(err)]
        if dims.expert > 1:
            if self.cpu_offload:
                return [f"strategy={self.name} with cpu_offload and expert_parallel_size={dims.expert}: the experts are "
                        "spread, not sharded by FSDP, and would stay on the device; drop one of them."]
            return experts.expert_problems(model, dims.expert, dims.tensor, dims.pipeline)
        if dims.tensor == 1:
            return []
        label = f"auto ({dims.tensor})" if self.dims_settings.tensor == "auto" else str(dims.tensor)
        return self.tensor.problems(model, dims.tensor, label)

    def layout(self, world_size: int, model: torch.nn.Module | None = None) -> Layout:
        dims = self.parallel_dims(world_size)
        shards = dims.shard if dims.replicate > 1 else world_size
        if dims.expert > 1 and model is not None and not self.pipelined:  # the experts: 1/E of them on each rank
            return Layout(shards, tuple(self._mesh_lines(dims, model)), spread_parameters=experts.trainable(model),
                          spread_ranks=dims.expert)
        if self.pipelined:
            lines = layout_lines(self.pipeline, dims, model, self.loop_settings.micro_batch_size)
            if model is None:
                return Layout(shards, tuple(lines))
            # the most loaded pipeline rank's parameters; the first stage's activations at once
            return Layout(shards, tuple(lines), max(rank_parameters(self.pipeline, dims, model)),
                          first_stage_activations(self.pipeline, dims, model))
        return Layout(shards, tuple(self._mesh_lines(dims, model)))

    def _mesh_lines(self, dims: ParallelDims, model) -> list[str]:
        if dims.replicate > 1:
            return [f"mesh: {dims.replicate} replica(s) x {dims.shard} shard(s): the states are sharded over "
                    f"{dims.shard} rank(s) and replicated {dims.replicate} time(s)"]
        if dims.expert > 1:
            if model is None:
                return [f"mesh: {dims.describe()}"]
            loop = self.loop_settings
            tokens = loop.micro_batch_size * loop.accumulate * getattr(model, "block_size", 0)
            return [f"mesh: {dims.describe()}", experts.describe(model, dims.expert, tokens)]
        if dims.tensor == 1:
            return []
        lines = [f"mesh: {dims.describe()}: each batch computed by {dims.tensor} rank(s) together, the states of the "
                 "split layers divided over every rank, the rest over the data-parallel ranks (the estimate below "
                 "divides all of them by every rank)"]
        return lines + ([self.tensor.describe(model)] if model is not None else [])

    # ---- building: on the meta device, then the appliers in order ------------------------------
    def build_model(self, factory, adapter=None):
        """On the meta device, the adapter's layers too (their initialisation recorded and replayed
        into the shards); with pipeline stages, cut into them and this rank's kept."""
        if not self.meta_init:
            whole = with_adapter(factory(), adapter)
        else:
            whole, log = build_on_meta(lambda: with_adapter(factory(), adapter))
            if log.problem:
                self._say(f"{self.name}: building {type(whole).__name__} whole on every rank before sharding: "
                          f"{log.problem}")
                whole = with_adapter(factory(), adapter)
            else:
                self._init_log = log
        if not self.pipelined:
            return whole
        self._plan = self.tensor.plan(whole)  # the whole model's (its class names the source)
        self._run = PipelineRun(self.pipeline, self.dims, self.global_rank, self.root_device, self.name)
        part = self._run.split(whole)
        self._say(f"{self.name}: {describe_pipeline(self.pipeline, self.dims)}; layers per stage {self._run.layers}")
        return part

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Tensor parallelism, then FSDP2 over the data-parallel ranks (each stage a root of its own),
        then this rank's tensors materialised."""
        dims = self.dims
        if dims.replicate > 1:
            self._say(f"{self.name}: {self._mesh_lines(dims, None)[0]}")
        if dims.tensor > 1:
            plan = self._plan if self.pipelined else self.tensor.plan(model)
            done = apply_tensor_parallel(model, self.mesh["tensor"], plan, self.tensor.sequence_parallel)
            self._say(f"{self.name}: {dims.describe()}; {done}")
        ignored = set()
        if dims.expert > 1:  # the tokens counted over the data-parallel ranks (not the tensor ranks or other stages)
            tokens = "default" if dims.tensor == 1 and not self.pipelined else self.mesh["shard"].get_group()
            mesh = dims.build_expert_mesh(self.root_device.type, tensor_dim=not experts.expert_layers(model))
            self._experts = experts.apply_expert_parallel(model, mesh, tokens, dims.data_parallel)
            ignored = experts.expert_parameters(model)
            self._say(f"{self.name}: {experts.describe(model, dims.expert)}")
        elif self.pipelined or dims.tensor > 1:  # the routing statistics counted over the data-parallel ranks only
            experts.token_groups(model, self.mesh["shard"].get_group() if dims.data_parallel > 1 else None)
        if not self.pipelined or dims.data_parallel > 1:
            units = self.units(model)
            roots = list(model.stages.values()) if self.pipelined else [model]
            if not self.pipelined:
                self._say(f"{self.name}: sharding units: {units.describe()}")
            dp_mesh = self.mesh["replicate", "shard"] if dims.replicate > 1 else self.mesh["shard"]
            apply_fully_shard(roots, units, shard_kwargs(dp_mesh, self.precision, self.reshard_after_forward,
                                                         self.cpu_offload, self.root_device, ignored))
        if self._init_log is not None:
            log, self._init_log = self._init_log, None
            device = torch.device("cpu") if self.cpu_offload else self.root_device
            (PipelineRun.materialise if self.pipelined else materialise)(model, log, device)
        if self.pipelined:
            self._run.attach(model, self.mesh)
        return model

    def _say(self, line: str) -> None:
        if self.is_global_zero:
            print(line, flush=True)

    # ---- a step ---------------------------------------------------------------------------------
    def forward_backward(self, model, task, batch, group, scale, loss_of):
        if not self.pipelined:
            return super().forward_backward(model, task, batch, group, scale, loss_of)
        return self._run.forward_backward(model, task, batch, group, scale, self.forward_context, loss_of)

    def no_backward_sync(self, model, skip: bool):
        """While accumulating, keep unsharded gradients and reduce-scatter once per step (a pipeline:
        torch's PipelineStage defers the reduction to the schedule's last microbatch itself)."""
        if self.pipelined:
            return nullcontext()

        @contextmanager
        def toggled():
            model.set_requires_gradient_sync(not skip)
            yield

        return toggled()

    def clip_gradients(self, model, optimizer, max_norm=None, max_value=None, parameters=None):
        """Over every mesh the parameters live on and every stage (a tied head's gradient summed
        with its embedding's first, and counted once)."""
        if self._experts is not None:
            self._experts.finish_gradients()
        counted, across = None, None
        if self.pipelined:
            self._run.tie_gradients(model)
            counted, across = self._run.counted(model), self._run.group
        params = list(model.parameters() if parameters is None else parameters)
        return clip_gradients(params, optimizer, self.precision, max_norm, max_value, self.root_device,
                              by_hand=self.pipelined or self.dims.tensor > 1 or self.dims.expert > 1, counted=counted,
                              across=across)

    def optimizer_step(self, optimizer) -> bool:
        if self._experts is not None:
            self._experts.finish_gradients()
        return super().optimizer_step(optimizer)

    def zero_grad(self, optimizer) -> None:
        super().zero_grad(optimizer)
        if self._experts is not None:
            self._experts.finished = False

    # ---- checkpoints (mesh/state.py) -----------------------------------------------------------------
    @property
    def _by_hand(self) -> bool:
        """Whether state is gathered tensor by tensor (split layers, stages) rather than by DCP."""
        return self.pipelined or self.dims.tensor > 1

    def model_state_dict(self, model) -> dict:
        if not self._by_hand:
            return super().model_state_dict(model)
        own = state.own_model_state(model)  # collective: every rank gathers its stages' tensors
        if self.pipelined:
            return self._run.merged_model_state(own, self.world_size)
        return own if self.is_global_zero else {}

    def optimizer_state_dict(self, model, optimizer) -> dict:
        if not self._by_hand:
            return super().optimizer_state_dict(model, optimizer)
        own = state.own_optimizer_state(model, optimizer)
        if self.pipelined:
            return self._run.merged_optimizer_state(own, self.world_size)
        return own if self.is_global_zero else {}

    def load_model_state_dict(self, model, full: dict) -> None:
        if not self.pipelined:
            super().load_model_state_dict(model, full)
            state.place_fused(self.unwrap(model), full)
            return
        mine, strict = self._run.own_model_state(model, full, self.world_size)
        state.load_whole_model_state(model, mine, strict)

    def load_optimizer_state_dict(self, model, optimizer, full: dict) -> None:
        if self.pipelined:
            full = state.pipeline_optimizer_state(model, full)
        super().load_optimizer_state_dict(model, optimizer, full)
        state.place_fused(self.unwrap(model), None, optimizer, full)

    def sharded_state_dict(self, model, optimizer) -> dict:
        """A fused layer's split thirds (a strided shard, which DCP cannot describe as one chunk per
        rank) laid out as one contiguous chunk per data-parallel rank (copies: loading places them
        back, framework/strategy/base.py)."""
        return state.contiguous(super().sharded_state_dict(model, optimizer))
