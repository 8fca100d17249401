"""The FSDP2 family's one strategy: a layout resolved from the parallel-dims spec (dims.py) and built
by its appliers, run in one fixed order (ORDER; what an applier is: applier.py): tensor parallelism,
context parallelism, the experts' routing or spreading, FSDP2 sharding, the pipeline split. The
strategy loops over them and never asks which dimension is there; clipping and checkpoint state are
written once for every layout (gradients.py, state.py). The options fsdp, fsdp_cpu_offload, hsdp,
model_parallel and pipeline are presets of it: each sets the settings from its own keys and names
itself in every message (framework/strategy/<option>.py)."""
from __future__ import annotations

import logging
import math
from contextlib import ExitStack, contextmanager, nullcontext

import torch

from framework.config.types import PositiveInt
from framework.construction.meta_init import InitLog, build_on_meta
from framework.construction.prepare import convert_precision, place_model, with_adapter
from framework.construction.units import DEFAULT_MIN_UNIT_PARAMS, Units, choose_units
from framework.errors import ConfigError
from framework.strategy.abilities import Abilities
from framework.strategy.base import DataParallel, Layout
from framework.strategy.layout import StateLayout
from framework.strategy.mesh import state
from framework.strategy.mesh.applier import Applier, checked
from framework.strategy.mesh.context import ContextApplier
from framework.strategy.mesh.dims import DimsSettings, ParallelDims, keyed
from framework.strategy.mesh.experts import ExpertApplier, RoutingApplier
from framework.strategy.mesh.fully_shard import ShardingApplier, materialise, token_mesh
from framework.strategy.mesh.gradients import clip_gradients
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
        self.__dict__.update({d.key: sizes[d.setting_name] for d in keyed()})  # strategy.<key>, as given
        self.wrap_modules = None if wrap_modules is None else list(wrap_modules)
        self.min_unit_params, self.reshard_after_forward = min_unit_params, reshard_after_forward
        self.cpu_offload, self.meta_init = cpu_offload, meta_init
        self._init_log: InitLog | None = None
        self._mesh = None
        self._resolved: dict[tuple[int, int], ParallelDims] = {}
        self._appliers: dict[int, list[Applier]] = {}

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

    def appliers(self, world_size: int | None = None) -> list[Applier]:
        """The layout's appliers for `world_size` ranks (default: this run's), in ORDER. Where the
        sizes do not resolve (problems() says why), those the settings alone call for."""
        world_size = self.world_size if world_size is None else world_size
        if world_size not in self._appliers:
            try:
                dims = self.parallel_dims(world_size)
            except ConfigError:
                return [kind(self, None) for kind in ORDER if kind.wanted(self, None)]
            self._appliers[world_size] = checked([kind(self, dims) for kind in ORDER if kind.wanted(self, dims)])
        return self._appliers[world_size]

    def planned_appliers(self) -> list[Applier]:
        """Before launch: the appliers of the planned world (devices x num_nodes)."""
        return self.appliers(self.devices * self.num_nodes)

    @property  # what the layout can do (the compatibility table reads it)
    def abilities(self) -> Abilities:
        return Abilities().combined([a.abilities for a in self.planned_appliers()])

    @property
    def states(self) -> StateLayout:  # type: ignore[override]
        return self.layout(self.devices * self.num_nodes).states

    @property
    def mesh(self):
        """The device mesh, made on first use in a worker."""
        if self._mesh is None:
            kept = tuple(d for a in self.appliers() for d in a.mesh_dims)
            self._mesh = self.dims.build_mesh(self.root_device.type, kept)
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
        units = choose_units(model, self.wrap_modules, self.min_unit_params)
        for applier in self.planned_appliers():
            units = applier.units(units, model)
        return units

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
        return next((found for a in self.planned_appliers() if (found := a.problems(model))), [])

    def layout(self, world_size: int, model: torch.nn.Module | None = None) -> Layout:
        appliers = self.appliers(world_size)
        lines = tuple(line for a in appliers for line in a.lines(model))
        dims = self._resolved.get((world_size, self.devices))
        layout = Layout(world_size, dims.unnamed(lines) if dims is not None else lines)
        for applier in appliers:
            layout = applier.layout(layout, model)
        return layout

    # ---- building: on the meta device, then the appliers in order ------------------------------
    def build_model(self, factory, adapter=None):
        """On the meta device, the adapter's layers too (their initialisation recorded and replayed
        into the shards); then each applier's cut (a pipeline keeps this rank's stages)."""
        if not self.meta_init:
            model = with_adapter(factory(), adapter)
        else:
            model, log = build_on_meta(lambda: with_adapter(factory(), adapter))
            if log.problem:
                self._say(f"{self.name}: building {type(model).__name__} whole on every rank before sharding: "
                          f"{log.problem}")
                model = with_adapter(factory(), adapter)
            else:
                self._init_log = log
        for applier in self.appliers():
            model = applier.build(model)
        return model

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The appliers in order, then this rank's tensors materialised, then their last steps."""
        for applier in self.appliers():
            applier.apply(model)
        if self._init_log is not None:
            log, self._init_log = self._init_log, None
            device = torch.device("cpu") if self.cpu_offload else self.root_device
            if not any(applier.materialise(model, log, device) for applier in self.appliers()):
                materialise(model, log, device)
        for applier in self.appliers():
            applier.finish(model)
        return model

    def place_frozen(self, factory):
        """Laid out as the trained model, by appliers of its own (they keep what they set up)."""
        kept, self._appliers = self._appliers, {}
        try:
            model = convert_precision(self.build_model(factory).requires_grad_(False), self.precision, False)
            return self.wrap_model(place_model(model, self.root_device)).eval()
        finally:
            self._appliers = kept

    def roots(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """The modules FSDP2 shards as roots: the model, or what an applier says (a rank's stages)."""
        return next((roots for a in self.appliers() if (roots := a.roots(model)) is not None), [model])

    def ignored_parameters(self) -> set:
        return set().union(*(a.ignored_parameters() for a in self.appliers()))

    def _say(self, line: str) -> None:
        if self.is_global_zero:
            print(line, flush=True)

    # ---- a step ---------------------------------------------------------------------------------
    def split_batch(self, batch):
        for applier in self.appliers():
            batch = applier.split_batch(batch)
        return batch

    def forward_backward(self, model, task, batch, group, scale, loss_of):
        scale = None if scale is None else scale * math.prod(a.loss_weight for a in self.appliers())
        for applier in self.appliers():  # a schedule that runs the passes itself (a pipeline)
            ran = applier.forward_backward(model, task, batch, group, scale, loss_of)
            if ran is not None:
                return ran
        return super().forward_backward(model, task, batch, group, scale, loss_of)

    @contextmanager
    def no_backward_sync(self, model, skip: bool):
        """While accumulating, keep unsharded gradients and reduce-scatter once per step (a pipeline:
        torch's PipelineStage defers the reduction to the schedule's last microbatch itself)."""
        with ExitStack() as stack:
            for context in (a.no_sync(model, skip) for a in self.appliers()):
                stack.enter_context(context or nullcontext())
            yield

    def clip_gradients(self, model, optimizer, max_norm=None, max_value=None, parameters=None):
        """Over every mesh the parameters live on and every stage (a tied head's gradient summed
        with its embedding's first, and counted once)."""
        appliers = self.appliers()
        for applier in appliers:
            applier.before_clip(model)
        counted = next((c for a in appliers if (c := a.counted(model)) is not None), None)
        across = next((a.norm_group for a in appliers if a.norm_group is not None), None)
        params = list(model.parameters() if parameters is None else parameters)
        return clip_gradients(params, optimizer, self.precision, max_norm, max_value, self.root_device,
                              by_hand=any(a.norm_by_hand for a in appliers), counted=counted, across=across)

    def optimizer_step(self, optimizer) -> bool:
        for applier in self.appliers():
            applier.before_step()
        return super().optimizer_step(optimizer)

    def zero_grad(self, optimizer) -> None:
        super().zero_grad(optimizer)
        for applier in self.appliers():
            applier.after_zero_grad()

    # ---- checkpoints (mesh/state.py) -----------------------------------------------------------------
    @property
    def _by_hand(self) -> bool:  # state gathered tensor by tensor (split layers, stages), not by DCP
        return any(a.state_by_hand for a in self.appliers())

    def _merged(self, own: dict, merge: str) -> dict:
        merged = next((m for a in self.appliers() if (m := getattr(a, merge)(own)) is not None), None)
        return merged if merged is not None else own if self.is_global_zero else {}

    def model_state_dict(self, model) -> dict:
        if not self._by_hand:
            return super().model_state_dict(model)
        return self._merged(state.own_model_state(model), "merge_model_state")  # collective

    def optimizer_state_dict(self, model, optimizer) -> dict:
        if not self._by_hand:
            return super().optimizer_state_dict(model, optimizer)
        return self._merged(state.own_optimizer_state(model, optimizer), "merge_optimizer_state")

    def load_model_state_dict(self, model, full: dict) -> None:
        if any(applier.load_model_state(model, full) for applier in self.appliers()):
            return
        super().load_model_state_dict(model, full)
        state.place_fused(self.unwrap(model), full)

    def load_optimizer_state_dict(self, model, optimizer, full: dict) -> None:
        for applier in self.appliers():
            full = applier.optimizer_state_to_load(model, full)
        super().load_optimizer_state_dict(model, optimizer, full)
        state.place_fused(self.unwrap(model), None, optimizer, full)

    def sharded_state_dict(self, model, optimizer) -> dict:
        """A fused layer's thirds laid out as one chunk per data-parallel rank (mesh/state.py)."""
        return state.contiguous(super().sharded_state_dict(model, optimizer))
