"""The FSDP2 family's one strategy: a layout resolved from the parallel-dims spec (dims.py) and built
by its appliers, run in one fixed order (ORDER; what an applier is: applier.py): tensor parallelism,
context parallelism, the experts' routing or spreading, FSDP2 sharding, the pipeline split. Each
model has a layout of its own (model_layout.py: the trained model's, a frozen second model's) that
combines its appliers' hooks; the strategy asks it and never asks which dimension is there; clipping
and checkpoint state are written once for every layout (gradients.py, state.py). The options fsdp, fsdp_cpu_offload, hsdp,
model_parallel and pipeline are presets of it: each sets the settings from its own keys and names
itself in every message (framework/strategy/<option>.py)."""
from __future__ import annotations

import logging

import torch

from framework.config.types import PositiveInt
from framework.construction.meta_init import build_on_meta
from framework.construction.prepare import convert_precision, place_model, with_adapter
from framework.construction.units import DEFAULT_MIN_UNIT_PARAMS, Units
from framework.errors import ConfigError
from framework.strategy.abilities import Abilities
from framework.strategy.base import DataParallel, Layout
from framework.strategy.layout import StateLayout
from framework.strategy.mesh import state
from framework.strategy.mesh.applier import Applier
from framework.strategy.mesh.context import ContextApplier
from framework.strategy.mesh.dims import DimsSettings, ParallelDims, keyed
from framework.strategy.mesh.experts import ExpertApplier, RoutingApplier
from framework.strategy.mesh.fully_shard import ShardingApplier, token_mesh
from framework.strategy.mesh.gradients import clip_gradients
from framework.strategy.mesh.model_layout import ModelLayout
from framework.strategy.mesh.pipeline.applier import PipelineApplier
from framework.strategy.mesh.pipeline.settings import PipelineSettings
from framework.strategy.mesh.tensor_parallel import TensorApplier, TensorParallelSettings
from framework.strategy.parallel import ParallelStrategy

#: the appliers in the order they build a layout (each joins where its `wanted` says the layout has it)
ORDER: tuple[type[Applier], ...] = (TensorApplier, ContextApplier, RoutingApplier, ExpertApplier, ShardingApplier,
                                    PipelineApplier)


class MeshStrategy(ParallelStrategy):
    """Any layout of pipeline x (replicate x shard x context) x tensor ranks over FSDP2. Built on the
    meta device and materialised shard by shard (a pipeline rank: its stages only). The loop talks
    to it as to any strategy; with pipeline stages each micro-batch's forward and backward run in
    the schedule (`forward_backward`)."""

    name = "fsdp"
    shards_states = True
    requires_torch = "2.6"  # fully_shard (FSDP2) public in torch.distributed.fsdp; the compatibility table reads it

    def __init__(self, *args, dims: DimsSettings = DimsSettings(), pipeline: PipelineSettings | None = None,
                 tensor: TensorParallelSettings = TensorParallelSettings(), wrap_modules: list[str] | None = None,
                 min_unit_params: PositiveInt = DEFAULT_MIN_UNIT_PARAMS, reshard_after_forward: bool = True,
                 cpu_offload: bool = False, meta_init: bool = True, timeout_s: float = 1800.0, **kwargs):
        """dims: the sizes as the preset's keys set them; pipeline: the pipeline's settings (None: no
        stages); tensor: the tensor-parallel plan. The keys every preset has: wrap_modules: class
        names of the modules to shard as units (e.g. [Block]); null: the framework chooses (the
        model's sharding_units, _no_split_modules, else the size rule); []: only the root;
        min_unit_params: the size rule's threshold; reshard_after_forward: free gathered parameters
        after forward (less memory, one more all-gather in backward); cpu_offload: keep sharded
        parameters, gradients and optimizer state in CPU memory; meta_init: build on the meta device
        and materialise shards only (false: every rank builds the whole model first); timeout_s: how
        long a collective may wait; and each keyed dimension's size (`keyword_parameters`:
        expert_parallel_size, context_parallel_size; framework/strategy/mesh/dims.py says what each does)."""
        sizes = {d.setting_name: kwargs.pop(d.key, d.default) for d in keyed()}
        super().__init__(*args, timeout_s=timeout_s, **kwargs)
        self.dims_settings, self.pipeline, self.tensor = dims.replace(**sizes), pipeline, tensor
        for d in keyed():  # strategy.<key>, as given
            setattr(self, d.key, sizes[d.setting_name])
        self.wrap_modules = None if wrap_modules is None else list(wrap_modules)
        self.min_unit_params, self.reshard_after_forward = min_unit_params, reshard_after_forward
        self.cpu_offload, self.meta_init = cpu_offload, meta_init
        self._mesh = None
        self._resolved: dict[tuple[int, int], ParallelDims] = {}
        self._layouts: dict[int, ModelLayout] = {}  # the trained model's, per world size

    @classmethod
    def keyword_parameters(cls) -> dict:
        """The keys `**kwargs` takes besides the base's: one per keyed dimension (framework/config/targets.py)."""
        return {d.key: d.keyword() for d in keyed()}

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

    def model_layout(self, world_size: int | None = None) -> ModelLayout:
        """The trained model's layout for `world_size` ranks (default: this run's). Where the sizes
        do not resolve (problems() says why), one of the appliers the settings alone call for."""
        world_size = self.world_size if world_size is None else world_size
        if world_size not in self._layouts:
            try:
                dims = self.parallel_dims(world_size)
            except ConfigError:
                return ModelLayout(self, None, ORDER)
            self._layouts[world_size] = ModelLayout(self, dims, ORDER)
        return self._layouts[world_size]

    def appliers(self, world_size: int | None = None) -> list[Applier]:
        """The trained model's appliers for `world_size` ranks (default: this run's), in ORDER."""
        return self.model_layout(world_size).appliers

    def planned_layout(self) -> ModelLayout:
        """Before launch: the layout of the planned world (devices x num_nodes)."""
        return self.model_layout(self.devices * self.num_nodes)

    @property  # what the layout can do (the compatibility table reads it)
    def abilities(self) -> Abilities:
        return self.planned_layout().abilities

    @property
    def states(self) -> StateLayout:  # type: ignore[override]
        return self.layout(self.devices * self.num_nodes).states

    @property
    def mesh(self):
        """The device mesh, made on first use in a worker."""
        if self._mesh is None:
            self._mesh = self.dims.build_mesh(self.root_device.type, self.model_layout().mesh_dims)
        return self._mesh

    @property
    def data_parallel(self) -> DataParallel:
        return self.dims.data_share(self.global_rank)

    def token_group(self):
        """The ranks that read different tokens (a mixture of experts counts its routing over them):
        None where they are the whole world, "single" where this rank alone."""
        return self.dims.token_ranks(lambda: token_mesh(self.mesh, self.dims).get_group())

    def setup_environment(self) -> None:
        super().setup_environment()  # DTensor's warning at every 2-D gather (a checkpoint, the norm): not the user's
        logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)

    # ---- before launch --------------------------------------------------------------------------
    def units(self, model: torch.nn.Module) -> Units:
        """The modules sharded as units (the same rule `framework plan` and `validate` use), as the
        appliers leave them (experts spread: not gathered)."""
        return self.planned_layout().units(model)

    def problems(self, model: torch.nn.Module | None) -> list[str]:
        try:
            self.parallel_dims(self.devices * self.num_nodes)
        except ConfigError as err:
            return [str(err)]
        if model is not None:
            try:
                self.units(model)  # a wrap_modules name the model does not have
            except ConfigError as err:
                return [str(err)]
        return self.planned_layout().problems(model)

    def layout(self, world_size: int, model: torch.nn.Module | None = None) -> Layout:
        return self.model_layout(world_size).layout(world_size, model)

    # ---- building: on the meta device, then the appliers in order ------------------------------
    def build_model(self, factory, adapter=None):
        return self._build(factory, adapter, self.model_layout())

    def _build(self, factory, adapter, layout: ModelLayout):
        """On the meta device, the adapter's layers too (their initialisation recorded in `layout`
        and replayed into the shards); then each applier's cut (a pipeline keeps this rank's stages)."""
        if not self.meta_init:
            model = with_adapter(factory(), adapter)
        else:
            model, log = build_on_meta(lambda: with_adapter(factory(), adapter))
            if log.problem:
                self._say(f"{self.name}: building {type(model).__name__} whole on every rank before sharding: "
                          f"{log.problem}")
                model = with_adapter(factory(), adapter)
            else:
                layout.init_log = log
        return layout.build(model)

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The appliers in order, then this rank's tensors materialised, then their last steps."""
        return self.model_layout().wrap(model, torch.device("cpu") if self.cpu_offload else self.root_device)

    def place_frozen(self, factory):
        """Laid out as the trained model, by a layout of its own (its appliers keep what they set up)."""
        layout = ModelLayout(self, self.dims, ORDER)
        model = convert_precision(self._build(factory, None, layout).requires_grad_(False), self.precision, False)
        device = torch.device("cpu") if self.cpu_offload else self.root_device
        return layout.wrap(place_model(model, self.root_device), device).eval()

    def _say(self, line: str) -> None:
        if self.is_global_zero:
            print(line, flush=True)

    # ---- a step ---------------------------------------------------------------------------------
    def split_batch(self, batch):
        return self.model_layout().split_batch(batch)

    def forward_backward(self, model, task, batch, group, scale, loss_of):
        layout = self.model_layout()
        scale = None if scale is None else scale * layout.loss_weight
        ran = layout.forward_backward(model, task, batch, group, scale, loss_of)  # a schedule's (a pipeline)
        return ran if ran is not None else super().forward_backward(model, task, batch, group, scale, loss_of)

    def no_backward_sync(self, model, skip: bool):
        """While accumulating, keep unsharded gradients and reduce-scatter once per step (a pipeline:
        torch's PipelineStage defers the reduction to the schedule's last microbatch itself)."""
        return self.model_layout().no_sync(model, skip)

    def clip_gradients(self, model, optimizer, max_norm=None, max_value=None, parameters=None):
        """Over every mesh the parameters live on and every stage (a tied head's gradient summed
        with its embedding's first, and counted once)."""
        by_hand, counted, across = self.model_layout().clip_inputs(model)
        params = list(model.parameters() if parameters is None else parameters)
        return clip_gradients(params, optimizer, self.precision, max_norm, max_value, self.root_device,
                              by_hand=by_hand, counted=counted, across=across)

    def optimizer_step(self, optimizer) -> bool:
        self.model_layout().before_step()
        return super().optimizer_step(optimizer)

    def zero_grad(self, optimizer) -> None:
        super().zero_grad(optimizer)
        self.model_layout().after_zero_grad()

    # ---- checkpoints (mesh/state.py) -----------------------------------------------------------------
    def _merged(self, own: dict, merge: str) -> dict:
        merged = self.model_layout().merged(own, merge)
        return merged if merged is not None else own if self.is_global_zero else {}

    def model_state_dict(self, model) -> dict:
        if not self.model_layout().state_by_hand:
            return super().model_state_dict(model)
        return self._merged(state.own_model_state(model), "merged_model_state")  # collective

    def optimizer_state_dict(self, model, optimizer) -> dict:
        if not self.model_layout().state_by_hand:
            return super().optimizer_state_dict(model, optimizer)
        return self._merged(state.own_optimizer_state(model, optimizer), "merged_optimizer_state")

    def load_model_state_dict(self, model, full: dict) -> None:
        if self.model_layout().load_model_state(model, full):
            return
        super().load_model_state_dict(model, full)
        state.place_fused(self.unwrap(model), full)

    def load_optimizer_state_dict(self, model, optimizer, full: dict) -> None:
        full = self.model_layout().optimizer_state_to_load(model, full)
        super().load_optimizer_state_dict(model, optimizer, full)
        state.place_fused(self.unwrap(model), None, optimizer, full)

    def sharded_state_dict(self, model, optimizer) -> dict:
        """A fused layer's thirds laid out as one chunk per data-parallel rank (mesh/state.py)."""
        return state.contiguous(super().sharded_state_dict(model, optimizer))
