"""DeepSpeed ZeRO stages 1-3, with optional CPU/NVMe offload (`strategy=deepspeed_stage_*`).

The DeepSpeed config is built from the five plugin groups and the loop settings (micro-batch
size, accumulation, clipping, precision); `config` adds or overrides raw DeepSpeed keys. A torch
optimizer (from `optimizer=`) is handed to DeepSpeed, so no DeepSpeed op is compiled unless the
raw config asks for DeepSpeed's own optimizer. `deepspeed` is imported only when chosen.
"""
from __future__ import annotations

import os
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import replace
from typing import Any, Literal

import torch

from framework.construction.meta_build import meta_device, sharded_build
from framework.construction.prepare import checkpoint_activations, with_adapter
from framework.strategy.abilities import Abilities
from framework.strategy.deepspeed import state as ds_state
from framework.strategy.deepspeed.arch_list import readable_arch_list
from framework.strategy.deepspeed.config import deep_merge, nvme_path_problems, refused_config
from framework.strategy.deepspeed.cpu_init import initialise_from_cpu
from framework.strategy.deepspeed.fused_adam import use_fused_adam
from framework.strategy.deepspeed.grad_buffer import release_gradient_buffer, zeros_on_demand
from framework.strategy.deepspeed.groups import forget_process_groups
from framework.strategy.deepspeed.imports import deepspeed_package, muon_left_uncompiled
from framework.strategy.deepspeed.master_weights import shared_master_partitions
from framework.strategy.deepspeed.op_locks import build_root_problem
from framework.strategy.deepspeed.sizes import nvme_param_swap, zero_sizes
from framework.strategy.layout import StateLayout
from framework.strategy.parallel import ParallelStrategy

OffloadDevice = Literal["none", "cpu", "nvme"]
class DeepSpeedStrategy(ParallelStrategy):
    """ZeRO data parallelism: stage 1 shards optimizer state, stage 2 also gradients, stage 3
    also parameters. The loop's accumulation stays the loop's: DeepSpeed runs in unmanaged
    accumulation mode (backward accumulates locally, `step` reduces and updates)."""

    name = "deepspeed"
    replica_groups_refusal = ("DeepSpeed's engine reduces the gradients and steps the optimizer in one call, its "
                              "partitioned states in buffers of its own: nothing between the backward and the step "
                              "where torchft could average the groups' gradients, no per-rank state to copy in a heal")
    shards_states = True
    setup_note = "a machine's first DeepSpeed run compiles its ops: a minute or more"
    requires_packages = {"deepspeed": "'framework[deepspeed]'"}
    # one optimizer driven by its engine, which also clips and steps in one call (no step to leave
    # out, no clipping by value); flat partitions of its own (checkpoint_io=dcp gets full tensors
    # from rank zero); always float32 master weights and no float64 mode; no trainer.compile
    ABILITIES = Abilities(manual_optimization=False, step_skipping=False, sharded_state=False, float64=False,
                          true_half_precision=False, fp16_needs_device_support=True, clip_grad_value=False,
                          compile=False)
    #: what a subclass (one per conf/strategy/deepspeed_stage_*.yaml) sets up when not told
    default_stage: int = 2
    default_offload_optimizer: str = "none"
    default_offload_parameters: str = "none"

    def __init__(self, *args, stage: Literal[0, 1, 2, 3] | None = None, offload_optimizer: OffloadDevice | None = None,
                 offload_parameters: OffloadDevice | None = None, nvme_path: str = "/local_nvme",
                 config: dict | None = None, partitioned_init: bool = True, fused_adam: bool = True,
                 timeout_s: float = 1800.0, **kwargs):
        """stage: ZeRO stage (0: plain data parallel); offload_optimizer: keep optimizer state (and
        the update) on cpu or nvme (stages 1-3); offload_parameters: keep parameters on cpu or
        nvme (stage 3); nvme_path: folder on a fast local disk for nvme offload; config: raw
        DeepSpeed keys merged over the generated config (ZeRO sizes not given there are derived from
        the model: framework/strategy/deepspeed/sizes.py); partitioned_init: under ZeRO-3, build the
        model inside deepspeed.zero.Init (no rank holds all of it); fused_adam: run torch's Adam/AdamW
        fused over DeepSpeed's flat partitions when the optimizer config leaves `fused` unset (the
        default loop allocates several partition-sized temporaries per step: 0.1 GiB per rank on an
        85M model); timeout_s: collective timeout."""
        super().__init__(*args, timeout_s=timeout_s, **kwargs)
        self.stage = self.default_stage if stage is None else stage
        self.offload_optimizer = offload_optimizer or self.default_offload_optimizer
        self.offload_parameters = offload_parameters or self.default_offload_parameters
        self.nvme_path = nvme_path
        self.raw_config = dict(config or {})
        self.partitioned_init = partitioned_init
        self.fused_adam = fused_adam
        self.engine = None

    @property
    def states(self) -> StateLayout:  # type: ignore[override]
        return StateLayout("zero", zero_stage=self.stage, offload_optimizer=self.offload_optimizer,
                           offload_parameters=self.offload_parameters)

    @property
    def abilities(self) -> Abilities:  # type: ignore[override]
        """NVMe offload needs libaio too; ZeRO-3's forward is collective."""
        nvme = "nvme" in (self.offload_optimizer, self.offload_parameters)
        # ZeRO-3 gathers each module's partitioned weights inside its forward
        abilities = replace(self.ABILITIES, collective_forward=self.stage == 3)
        return replace(abilities, native_libraries=("aio",)) if nvme else abilities

    # ---- environment --------------------------------------------------------------------
    def _choose_deepspeed_accelerator(self) -> None:
        """DeepSpeed reads DS_ACCELERATOR when it is first imported: set it before any import."""
        if self.accelerator.name == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")

    def setup_environment(self) -> None:
        self._choose_deepspeed_accelerator()
        said = readable_arch_list()
        if said and self.is_global_zero:
            print(said, flush=True)
        super().setup_environment()
        deepspeed = deepspeed_package()

        deepspeed.init_distributed(dist_backend=self.accelerator.distributed_backend, auto_mpi_discovery=False)

    # ---- config -------------------------------------------------------------------------
    def deepspeed_config(self, model=None) -> dict:
        """The generated config (sizes derived from `model` when given), raw `config` keys merged over it."""
        loop = self.loop_settings
        zero: dict[str, Any] = {"stage": self.stage, **(zero_sizes(model, self.stage) if model is not None else {})}
        pin = self.accelerator.name == "cuda"
        if self.offload_optimizer != "none":
            zero["offload_optimizer"] = {"device": self.offload_optimizer, "pin_memory": pin}
        if self.offload_parameters != "none":
            zero["offload_param"] = {"device": self.offload_parameters, "pin_memory": pin}
        for section in ("offload_optimizer", "offload_param"):
            if zero.get(section, {}).get("device") == "nvme":
                zero[section]["nvme_path"] = self.nvme_path
        if self.offload_parameters == "nvme" and model is not None:
            zero["offload_param"].update(nvme_param_swap(model, self.world_size))
        config: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": loop.micro_batch_size,
            "gradient_accumulation_steps": loop.accumulate,
            "managed_gradient_accumulation": False,
            "gradient_clipping": loop.clip_grad_norm or 0.0,
            "zero_optimization": zero,
            "zero_allow_untested_optimizer": True,
            "zero_force_ds_cpu_optimizer": False,
            "steps_per_print": 2**31 - 1,
            "wall_clock_breakdown": False,
        }
        compute = self.precision.sharded_param_dtypes()
        dtype = compute[0] if compute else self.precision.param_dtype
        if dtype == torch.bfloat16:
            config["bf16"] = {"enabled": True}
        elif dtype == torch.float16:
            config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
        return deep_merge(config, self.raw_config)

    def problems(self, model) -> list[str]:
        """The merged config through DeepSpeed's own config models, when the user added raw keys
        (`strategy.config`): a bad value is refused before any process starts. Without raw keys
        the generated config is known to be valid, and deepspeed is not imported. NVMe offload:
        a folder that cannot be written."""
        offloads = (self.offload_optimizer, self.offload_parameters)
        problems = nvme_path_problems(self.nvme_path, offloads) + [p for p in [build_root_problem()] if p]
        if not self.raw_config:
            return problems
        self._choose_deepspeed_accelerator()
        return problems + refused_config(self.deepspeed_config())

    # ---- model and optimizer ------------------------------------------------------------
    def build_model(self, factory, adapter=None):
        """ZeRO-3: built inside `deepspeed.zero.Init`, which partitions each submodule's
        parameters as soon as it is constructed (its `apply` gathers one module at a time), so
        no rank ever holds the whole model and the weights are an ordinary build's. An adapter is
        applied after, outside it: peft initialises its layers whole (B at zero), and
        `deepspeed.initialize` partitions them with the rest."""
        if self.stage != 3 or not self.partitioned_init:
            return super().build_model(factory, adapter)
        deepspeed = deepspeed_package()

        # zero.Init replaces torch.Tensor.__new__; a first import of torch._dynamo inside it (a
        # model library's lazy imports: transformers) checks that signature and fails
        import torch._dynamo  # noqa: F401

        remote = self.offload_parameters if self.offload_parameters != "none" else None
        # Built on the meta device first (no memory, no random numbers drawn): every module class the
        # factory imports lazily is imported here, outside zero.Init. zero.Init patches each module
        # class's __init__ while open and puts back what it found on entering, so a class first
        # defined inside it gets back its bare __init__, losing what a decorator wrapped around it
        # after (the kernels package's per-instance state, on transformers' attention): the next model
        # built (a frozen reference) would lack it. NVMe offload also sizes its swap buffers from this shape.
        with meta_device():
            shape = factory()
        rng_state = torch.get_rng_state()
        with deepspeed.zero.Init(config_dict_or_path=self.deepspeed_config(shape if remote == "nvme" else None),
                                 remote_device=remote,
                                 pin_memory=self.accelerator.name == "cuda"), sharded_build():
            model = factory()
        if self._device_draws_the_init() and remote != "nvme":
            problem = initialise_from_cpu(model, factory, rng_state)
            if problem and self.is_global_zero:
                print(f"{self.name}: the weights come from the {self.accelerator.name} random numbers ZeRO-3's build "
                      f"drew, not the CPU's of every other strategy ({problem})", flush=True)
        return with_adapter(model, adapter)

    def _device_draws_the_init(self) -> bool:
        """Whether zero.Init's build drew its random numbers from another generator than the CPU's:
        it builds on the accelerator (framework/strategy/deepspeed/cpu_init.py)."""
        return self.accelerator.name != "cpu"

    def setup(self, model, optimizer_factory):
        deepspeed = deepspeed_package()

        model = model.to(self.root_device)
        checkpoint_activations(model, self.units, self.loop_settings.activation_checkpointing, self.is_global_zero)
        config = self.deepspeed_config(model)
        if "optimizer" in config:  # DeepSpeed's own (compiled) optimizer, asked for in the raw config
            with self._initializing():
                engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                               config=config)
            base = optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer
        else:
            base = optimizer_factory(model.parameters())
            if self.fused_adam:
                use_fused_adam(base)
            muon_left_uncompiled()  # a torch optimizer: DeepSpeed only checks that it is not its Muon
            with self._initializing():
                engine, _, _, _ = deepspeed.initialize(model=model, optimizer=base, config=config)
        self.engine = engine
        return engine, base  # schedulers and LR monitors act on the torch optimizer's param_groups

    def place_frozen(self, factory):
        """ZeRO-3: partitioned as the trained model is, in an engine of its own without an optimizer
        (its forward gathers each module's parameters, DeepSpeed's ZeRO inference: trl places its
        reference so); stages 0-2 hold the trained model whole on every rank, and the frozen one too."""
        if self.stage != 3:
            return super().place_frozen(factory)
        model = self.build_model(factory).requires_grad_(False).to(self.root_device)
        config = {k: v for k, v in self.deepspeed_config(model).items() if k not in ("optimizer", "scheduler")}
        engine, _, _, _ = deepspeed_package().initialize(model=model, config=config)
        engine.eval()  # DeepSpeedEngine.eval returns None
        return engine

    @contextmanager
    def _initializing(self):
        """ZeRO-3's memory measures while deepspeed.initialize builds its optimizer: in float32 the
        parameter partition is the master partition, not a copy of it; on the CPU its zero-filled
        gradient buffers take memory only once written."""
        with ExitStack() as stack:
            if self.stage == 3:
                stack.enter_context(shared_master_partitions())
                if self.accelerator.name == "cpu":
                    stack.enter_context(zeros_on_demand())
            yield

    def teardown(self) -> None:
        self.engine = None  # the engine holds the model: free it (ParallelStrategy collects) before the group goes
        super().teardown()
        forget_process_groups()

    def unwrap(self, model):
        """The module of an engine: the trained model's, or a frozen model's (place_frozen); by its
        class's name, so that asking before launch does not import deepspeed."""
        engine = any(cls.__name__ == "DeepSpeedEngine" for cls in type(model).__mro__)
        return model.module if engine else model

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)  # the loop has already divided by the group size

    def no_backward_sync(self, model, skip: bool):
        return nullcontext()  # unmanaged accumulation: reduction happens in step()

    def clip_gradients(self, model, optimizer, max_norm=None, max_value=None, parameters=None):
        return None  # DeepSpeed clips inside step() (gradient_clipping in its config)

    def optimizer_step(self, optimizer) -> bool:
        self.engine.step()
        if self.stage == 3:
            release_gradient_buffer(self.engine.optimizer)  # until the next backward (on the CPU)
        return bool(getattr(self.engine, "_step_applied", True))

    def zero_grad(self, optimizer) -> None:
        """DeepSpeed's step() already zeroed the gradients."""

    # ---- checkpoint state: full fp32 tensors by parameter name, like every other strategy -------
    # (framework/strategy/deepspeed/state.py)
    def model_state_dict(self, model) -> dict:
        state = ds_state.full_model_state(self.unwrap(model))
        return state if self.is_global_zero else {}

    def optimizer_state_dict(self, model, optimizer) -> dict:
        state = ds_state.full_optimizer_state(self.unwrap(self.engine), self.engine.optimizer, optimizer)
        return state if self.is_global_zero else {}

    def load_model_state_dict(self, model, state: dict) -> None:
        ds_state.load_full_model_state(self.unwrap(model), state, self.root_device)

    def load_optimizer_state_dict(self, model, optimizer, state: dict) -> None:
        ds_state.load_full_optimizer_state(self.unwrap(self.engine), self.engine.optimizer, optimizer, state,
                                           self.root_device)
