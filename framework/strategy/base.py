"""The Strategy base class: the only object the training loop talks to."""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, ContextManager

import torch
import torch.distributed as dist

from framework.accelerator.base import Accelerator
from framework.accelerator.cpu import CPUAccelerator
from framework.checkpoint_io.base import CheckpointIO
from framework.checkpoint_io.torch import TorchCheckpointIO
from framework.cluster.base import ClusterEnvironment
from framework.cluster.local import LocalEnvironment
from framework.config.loop_settings import LoopSettings
from framework.construction.compile import compile_model
from framework.construction.prepare import checkpoint_activations, convert_precision, place_model, with_adapter
from framework.construction.quantized_build import build_quantized
from framework.construction.units import Units, choose_units
from framework.precision.base import Precision
from framework.precision.fp32 import FP32Precision
from framework.strategy import collectives
from framework.strategy.abilities import Abilities
from framework.strategy.layout import DataParallel, Layout, StateLayout
from framework.strategy.micro_batch import forward_backward as micro_batch_forward_backward
from framework.strategy.state_dicts import (
    full_model_state,
    full_optimizer_state,
    full_state_options,
    load_full_optimizer_state,
    load_sharded_state,
    set_model_state,
    sharded_state,
)
from framework.tensors import map_tensors


class Strategy:
    """Composes the other four plugins and exposes everything the loop needs: it wraps the model
    and optimizer, owns the processes and collectives, backward and step, and the state dicts.
    How a model is built and prepared lives in framework/construction/, memory estimates in
    framework/planning/, a rank's share of the data in framework/data/sampler.py.

    Method surface, in the order the runner and loop call it:
    - before launch: `problems(meta_model)`; `framework plan` and the preflight read
      `layout(world, meta_model)` (with `states`: how the model states lie).
    - `configure_loop(settings)`: micro-batch size, accumulation and clipping, in advance.
    - `setup_environment()`: in each worker, before anything else: device, process group.
    - `build_model(factory)`: the model, built so that a sharding strategy's ranks never hold all
      of it (framework/construction/meta_init.py); `units(model)`: what it gathers together and
      what activation checkpointing recomputes (framework/construction/units.py).
    - `setup(model, optimizer_factory) -> (model, optimizer)`: precision conversion, placement,
      wrapping (`wrap_model`), then the optimizer built over the wrapped parameters;
      `place_frozen(factory)`: a second, frozen model (a reference, a teacher) laid out alike.
    - per micro-batch: `batch_to_device` (moves), `split_batch` (this rank's share of it where its
      ranks split batches: framework/batch_split.py), then `forward_backward` (forward under
      `forward_context`, then `backward`), inside `no_backward_sync(model, skip)` while accumulating.
    - per optimizer step: `clip_gradients`, `optimizer_step` (False if skipped), `zero_grad`.
    - collectives: `barrier`, `broadcast`, `all_gather`, `reduce`, `any_rank`; `world_size`,
      `global_rank`, `local_rank`, `is_global_zero`.
    - checkpoints: `model_state_dict`, `optimizer_state_dict`, `load_model_state_dict`,
      `load_optimizer_state_dict`, their sharded forms for DCP, and `unwrap`; the precision's
      state (loss scale) and the checkpoint_io's bytes are read through `precision` and
      `checkpoint_io`.
    - `teardown()`: at the end, also after an error.

    The collectives work for any world size: with no process group they are identities.
    """

    name: str = "base"
    #: whether this strategy runs several processes (the compatibility table reads it)
    multi_process: bool = False
    #: whether it shards model states across ranks to save memory (the accelerator then favours
    #: low memory over speed where it has a choice: framework/accelerator/cpu.py)
    shards_states: bool = False
    #: how its model states lie across ranks, for `framework plan`'s bytes per rank
    #: (framework/planning/memory.py reads it from `layout`)
    states: StateLayout = StateLayout()
    #: why "setting up the model and optimizer" may take long (said when it does)
    setup_note: str = ""
    #: what it is and can do (pipeline stages, split layers, manual optimization, loss scaling,
    #: precisions, clipping by value, compile, step skipping, sharded checkpoint state...):
    #: framework/strategy/abilities.py; the compatibility table reads it
    abilities: Abilities = Abilities()
    #: why it cannot run inside replica groups (fault_tolerance=torchft), as the refusal says it;
    #: "": it can (rank r of every group holds the same part of the state, whatever the layout, so
    #: the gradients are averaged and a heal copied rank to rank)
    replica_groups_refusal: str = ""
    #: one process drives all of a node's devices (XLA SPMD): `devices` starts no processes
    spmd: bool = False
    #: an XLA strategy (accelerator=xla only)
    xla: bool = False

    def __init__(self, accelerator: Accelerator | None = None, precision: Precision | None = None,
                 checkpoint_io: CheckpointIO | None = None, cluster: ClusterEnvironment | None = None):
        self.accelerator = accelerator or CPUAccelerator()
        self.precision = precision or FP32Precision()
        self.checkpoint_io = checkpoint_io or TorchCheckpointIO()
        self.cluster = cluster or LocalEnvironment()
        self.root_device = torch.device("cpu")
        self.loop_settings = LoopSettings()
        #: devices per node and nodes (the `devices` and `num_nodes` keys), set when the plugins are
        #: built (framework/plugins.py)
        self.devices = 1
        self.num_nodes = 1
        #: (replica groups, this process's group): fault_tolerance=torchft deals the training data
        #: over the groups too (framework/data/sampler.py); set with devices
        self.replica_share = (1, 0)

    def configure_loop(self, settings: LoopSettings) -> None:
        """Told once, before `setup`, how the loop will accumulate and clip."""
        self.loop_settings = settings

    def problems(self, model: torch.nn.Module | None) -> list[str]:
        """Problems with this strategy's settings that only it (or the engine behind it) can judge,
        e.g. a unit class the model (built on the meta device; None when it could not be built)
        does not have; checked before launch, after `configure_loop`. One message per problem."""
        return []

    # ---- environment -------------------------------------------------------------------
    def setup_environment(self) -> None:
        self.root_device = self.accelerator.device_for(self.local_rank)
        self.accelerator.setup_device(self.root_device)
        self.accelerator.setup_host_memory(self.shards_states or self.precision.saves_memory)
        self.precision.setup(self.root_device.type)

    @property
    def world_size(self) -> int:
        return dist.get_world_size() if collectives.distributed() else 1

    @property
    def global_rank(self) -> int:
        return dist.get_rank() if collectives.distributed() else 0

    @property
    def local_rank(self) -> int:
        return self.cluster.local_rank() if collectives.distributed() else 0

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    @property
    def data_parallel(self) -> "DataParallel":
        """How the data is dealt over the ranks (framework/data/sampler.py): one share each, except
        under model_parallel, whose tensor-parallel ranks compute one batch together."""
        return DataParallel(self.world_size, self.global_rank)

    # ---- model and optimizer -----------------------------------------------------------
    def build_model(self, factory: Callable[[], torch.nn.Module], adapter=None) -> torch.nn.Module:
        """Build the model for `setup` (after `configure_loop`), with the adapter (the `adapter`
        group's object: its `apply(model)` injects trainable layers and freezes the rest) applied
        to it. The base class builds it whole; sharding strategies build it so that no rank holds
        all of it (framework/construction/meta_init.py); under a quantized precision its layers are
        quantized as they are made (framework/construction/quantized_build.py), and the adapter
        comes after, so its own layers stay in full precision (QLoRA)."""
        if adapter is not None:  # a run for little memory: freed buffers go back to the OS, as under sharding
            self.accelerator.setup_host_memory(True)
        if getattr(self.precision, "quantizes_while_building", False):
            return with_adapter(build_quantized(factory, self.precision), adapter)
        return with_adapter(factory(), adapter)

    def layout(self, world_size: int, model: torch.nn.Module | None = None) -> "Layout":
        """How `world_size` ranks hold the model (`framework plan` and the preflight read it; the
        model built on the meta device, or None). The base: states replicated or sharded over every
        rank (SPMD: every device of every process), nothing more to say."""
        return Layout(world_size * (self.devices if self.spmd else 1), states=self.states)

    def units(self, model: torch.nn.Module) -> Units:
        """The model's units (framework/construction/units.py): what sharding strategies gather
        together and what activation checkpointing recomputes. Sharding strategies pass their
        own settings (strategy.wrap_modules, min_unit_params)."""
        return choose_units(model)

    def setup(self, model: torch.nn.Module, optimizer_factory: Callable[..., torch.optim.Optimizer]):
        model = convert_precision(model, self.precision, self.is_global_zero)
        checkpoint_activations(model, self.units, self.loop_settings.activation_checkpointing, self.is_global_zero)
        if self.loop_settings.compile:  # by unit where hooks sit between units (sharding, recomputation), else whole
            by_unit = self.shards_states or self.loop_settings.activation_checkpointing
            compile_model(model, self.units if by_unit else None, self.is_global_zero)
        model = place_model(model, self.root_device)
        model = self.wrap_model(model)
        return model, optimizer_factory(model.parameters())

    def place_frozen(self, factory: Callable[[], torch.nn.Module]) -> torch.nn.Module:
        """A frozen model beside the trained one (a preference task's reference, a distillation's
        teacher): built as `build_model` builds, converted to the compute precision, on this rank's
        device and laid out as the trained model is where the strategy splits it; no gradients, no
        optimizer, not in checkpoints. The base: whole on every rank, as a replicated strategy holds
        the trained model (no DDP: it has nothing to reduce)."""
        model = self.build_model(factory).requires_grad_(False)
        model = convert_precision(model, self.precision, False)
        return place_model(model, self.root_device).eval()

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Wrap the placed model (DDP, FSDP, ...). The base class returns it unchanged."""
        return model

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return getattr(model, "module", model)

    def batch_to_device(self, batch: Any) -> Any:
        device = self.root_device
        if device.type != "cpu":  # the loaders' tensors are on the CPU already: no walk over the batch there
            batch = map_tensors(batch, lambda t: t.to(device, non_blocking=True))
        return self.precision.convert_input(batch)

    def split_batch(self, batch: Any) -> Any:
        """This rank's share of a moved batch where its ranks cut batches further (context
        parallelism: framework/strategy/mesh/context.py); the batch itself by default."""
        return batch

    def forward_context(self) -> ContextManager:
        return self.precision.forward_context()

    def backward(self, loss: torch.Tensor) -> None:
        self.precision.backward(loss)

    def forward_backward(self, model: torch.nn.Module, task, batch, group: int, scale: float | None,
                         loss_of: Callable[[Any], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward and backward of one loop micro-batch of a step of `group`: the loss (or with
        `scale` the summed loss times scale) and the model's own losses backpropagated
        (framework/strategy/micro_batch.py); (the loss the non-finite guard watches, its logged share)."""
        return micro_batch_forward_backward(self, model, task, batch, group, scale, loss_of)

    def no_backward_sync(self, model: torch.nn.Module, skip: bool) -> ContextManager:
        """While accumulating (`skip=True`), do not synchronise gradients across ranks."""
        return nullcontext()

    def clip_gradients(self, model, optimizer, max_norm=None, max_value=None, parameters=None) -> torch.Tensor | None:
        """Clip the gradients of `parameters` (default: the model's); returns the total norm
        before clipping, as a plain tensor on every rank (or None when not clipping by norm)."""
        parameters = model.parameters() if parameters is None else parameters
        return self.precision.clip_gradients(parameters, optimizer, max_norm, max_value)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        return self.precision.optimizer_step(optimizer)

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.zero_grad(set_to_none=True)

    # ---- collectives (framework/strategy/collectives.py): identities with no process group ------
    def barrier(self) -> None:
        collectives.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return collectives.broadcast(obj, src)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Stack every rank's `tensor` (same shape on each) into shape (world_size, *shape)."""
        return collectives.all_gather(tensor)

    def reduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        """Reduce `tensor` over all ranks with op in {sum, mean, max, min}; every rank gets it."""
        return collectives.reduce(tensor, op)

    def any_rank(self, flag: bool) -> bool:
        """Collective in a multi-process run: True on every rank when `flag` is True on any (how
        ranks agree to stop together: a failure, a signal). Also a barrier."""
        if self.world_size == 1:
            return flag
        return self.reduce(torch.tensor(float(flag), device=self.root_device), "max").item() > 0

    # ---- checkpoint state (framework/strategy/state_dicts.py) ---------------------------
    # Full state keyed by parameter name, the same for every wrapper, so a checkpoint moves between
    # strategies. Collective: every rank calls these; with several processes only rank zero
    # receives the tensors.
    def model_state_dict(self, model: torch.nn.Module) -> dict:
        return full_model_state(model)

    def load_model_state_dict(self, model: torch.nn.Module, state: dict) -> None:
        set_model_state(self, model, state, full_state_options(loading=True))

    def optimizer_state_dict(self, model, optimizer: torch.optim.Optimizer) -> dict:
        return full_optimizer_state(model, optimizer)

    def load_optimizer_state_dict(self, model, optimizer: torch.optim.Optimizer, state: dict) -> None:
        load_full_optimizer_state(model, optimizer, state)

    def sharded_state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
        """Collective: {"model": ..., "optimizer": ...} keyed by parameter name as in the full
        state, but each rank holding only its part, for a DCP write by every rank (checkpoint_io=dcp;
        no "optimizer" without one)."""
        return sharded_state(self, model, optimizer)

    def load_sharded_state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                                state_dir) -> None:
        """Collective: load a DCP directory written by any strategy at any world size (resharded on
        read). `optimizer=None` loads the weights only."""
        load_sharded_state(self, model, optimizer, state_dir)

    def teardown(self) -> None:
        self.checkpoint_io.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
