"""DeepSpeed ZeRO stages 1-3, with optional CPU/NVMe offload (`strategy=deepspeed_stage_*`).

The DeepSpeed config is built from the five plugin groups and the loop settings (micro-batch
size, accumulation, clipping, precision); `config` adds or overrides raw DeepSpeed keys. A torch
optimizer (from `optimizer=`) is handed to DeepSpeed, so no DeepSpeed op is compiled unless the
raw config asks for DeepSpeed's own optimizer. `deepspeed` is imported only when chosen.
"""
from __future__ import annotations

import gc
import os
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Literal

import torch

from framework.construction.meta_build import meta_device, sharded_build
from framework.construction.named_state import may_be_missing
from framework.construction.prepare import checkpoint_activations
from framework.errors import ConfigError
from framework.strategy.base import with_adapter
from framework.strategy.deepspeed.arch_list import readable_arch_list
from framework.strategy.deepspeed.cpu_init import initialise_from_cpu
from framework.strategy.deepspeed.grad_buffer import release_gradient_buffer, zeros_on_demand
from framework.strategy.deepspeed.groups import forget_process_groups
from framework.strategy.deepspeed.imports import deepspeed_package, muon_left_uncompiled
from framework.strategy.deepspeed.master_weights import shared_master_partitions
from framework.strategy.deepspeed.op_locks import build_root_problem
from framework.strategy.deepspeed.sizes import nvme_param_swap, zero_sizes
from framework.strategy.parallel import ParallelStrategy

OffloadDevice = Literal["none", "cpu", "nvme"]
# DeepSpeed's config models, by the section of its config each one reads (for error messages)
CONFIG_SECTIONS = {"DeepSpeedZeroConfig": "zero_optimization", "DeepSpeedBF16Config": "bf16",
                   "DeepSpeedFP16Config": "fp16", "DeepSpeedActivationCheckpointingConfig": "activation_checkpointing"}


def deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def use_fused_adam(optimizer) -> bool:
    """Switch a torch Adam/AdamW whose `fused` was left unset to its fused kernel, which updates
    in place (DeepSpeed hands it one flat partition per group, over which the default loop makes
    partition-sized temporaries). Returns whether it switched."""
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW) or optimizer.defaults.get("fused") is not None:
        return False
    if optimizer.defaults.get("foreach") or optimizer.defaults.get("differentiable"):
        return False
    for group in optimizer.param_groups:
        if any(not p.is_floating_point() for p in group["params"]):
            return False
    optimizer.defaults["fused"] = True
    for group in optimizer.param_groups:
        group["fused"] = True
    return True


class DeepSpeedStrategy(ParallelStrategy):
    """ZeRO data parallelism: stage 1 shards optimizer state, stage 2 also gradients, stage 3
    also parameters. The loop's accumulation stays the loop's: DeepSpeed runs in unmanaged
    accumulation mode (backward accumulates locally, `step` reduces and updates)."""

    name = "deepspeed"
    supports_compile = False  # trainer.compile: see the flag in framework/strategy/base.py
    shards_states = True
    memory_layout = "zero"
    setup_note = "a machine's first DeepSpeed run compiles its ops: a minute or more"
    requires_packages = {"deepspeed": "'framework[deepspeed]'"}
    supports_manual_optimization = False  # one optimizer, driven by its own engine/wrapper
    supports_step_skipping = False  # clipping and the step happen inside engine.step()
    # DeepSpeed keeps flat partitions of its own; checkpoint_io=dcp gets full tensors from rank zero
    supports_sharded_state = False
    supports_float64 = False
    supports_true_half_precision = False  # always float32 master weights
    fp16_needs_device_support = True
    supports_clip_grad_value = False
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
    def native_libraries(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("aio",) if "nvme" in (self.offload_optimizer, self.offload_parameters) else ()

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
        problems = self._nvme_path_problems() + [p for p in [build_root_problem()] if p]
        if not self.raw_config:
            return problems
        self._choose_deepspeed_accelerator()
        deepspeed_package()
        from deepspeed.runtime.config import DeepSpeedConfig
        from pydantic import ValidationError

        try:
            DeepSpeedConfig(self.deepspeed_config())
        except ValidationError as err:
            section = CONFIG_SECTIONS.get(err.title, err.title)
            return problems + [
                f"strategy.config.{section}.{'.'.join(map(str, e['loc']))}={e.get('input')!r}: DeepSpeed refuses "
                f"it: {e['msg']}. Fix or remove the key under strategy.config." for e in err.errors()]
        except (ValueError, AssertionError, KeyError, TypeError) as err:
            return problems + [f"strategy.config: DeepSpeed refuses the merged config: {err}. Fix or remove the "
                               "keys under strategy.config."]
        return problems

    def _nvme_path_problems(self) -> list[str]:
        """NVMe offload swaps into `nvme_path` (DeepSpeed creates the folder): it must be a writable
        folder, or creatable under a writable one."""
        if "nvme" not in (self.offload_optimizer, self.offload_parameters):
            return []
        path = Path(self.nvme_path).expanduser()
        existing = next(p for p in [path, *path.parents] if p.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            what = "is not a writable folder" if existing == path else f"cannot be created ({existing} is not writable)"
            return [f"strategy.nvme_path={self.nvme_path}: {what}; set strategy.nvme_path to a folder on a fast local "
                    "disk (e.g. strategy.nvme_path=/tmp/nvme)."]
        return []

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
        shape = None
        if remote == "nvme":  # zero.Init sizes its swap buffers from the config: learn the model's shape first
            with meta_device():
                shape = factory()
        rng_state = torch.get_rng_state()
        with deepspeed.zero.Init(config_dict_or_path=self.deepspeed_config(shape), remote_device=remote,
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
        self.engine = None  # the engine holds the model: free it before the process group goes
        gc.collect()
        super().teardown()
        forget_process_groups()

    def unwrap(self, model):
        return model.module if self.engine is not None and model is self.engine else model

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
    def _named_params(self):
        module = self.unwrap(self.engine)
        params = dict(module.named_parameters(remove_duplicate=False))
        return module, params

    def model_state_dict(self, model) -> dict:
        from deepspeed.utils import safe_get_full_fp32_param

        module, params = self._named_params()
        state = {}
        for key, value in module.state_dict(keep_vars=True).items():
            if key in params:
                full = safe_get_full_fp32_param(params[key])
                value = full if full is not None else params[key].detach()
            state[key] = value.detach().to("cpu", copy=True)
        return state if self.is_global_zero else {}

    def optimizer_state_dict(self, model, optimizer) -> dict:
        from deepspeed.utils import safe_get_full_optimizer_state

        module, params = self._named_params()
        inner_state = next(iter(optimizer.state.values()), {}) if optimizer.state else {}
        tensor_keys = [k for k, v in inner_state.items() if torch.is_tensor(v) and v.dim() > 0]
        step = inner_state.get("step")
        state = {}
        seen = set()
        for name, param in params.items():
            if id(param) in seen or not param.requires_grad:  # frozen (an adapter's base): no optimizer state
                continue
            seen.add(id(param))
            entry = {key: safe_get_full_optimizer_state(param, key).detach().cpu() for key in tensor_keys}
            if step is not None:
                entry["step"] = step.detach().cpu().clone() if torch.is_tensor(step) else torch.tensor(float(step))
            state[name] = entry
        groups = [{k: v for k, v in g.items() if k != "params"} | {"params": list(state)}
                  for g in optimizer.param_groups[:1]]
        return {"state": state, "param_groups": groups} if self.is_global_zero else {}

    def load_model_state_dict(self, model, state: dict) -> None:
        from deepspeed.utils import safe_set_full_fp32_param

        module, params = self._named_params()
        seen = set()
        for name, param in params.items():
            if id(param) in seen:
                continue
            seen.add(id(param))
            if name not in state:
                if may_be_missing(name, param):  # frozen, or an adapter's own weight (framework/adapter/)
                    continue
                raise ConfigError(f"the checkpoint has no weights for parameter '{name}'.")
            value = state[name].to(self.root_device, torch.float32)
            if hasattr(param, "ds_id") or hasattr(param, "_hp_mapping"):
                safe_set_full_fp32_param(param, value)
                self._refresh_low_precision(param, value)
            else:
                with torch.no_grad():
                    param.copy_(value)
        buffers = dict(module.named_buffers())
        with torch.no_grad():
            for name, buffer in buffers.items():
                if name in state:
                    buffer.copy_(state[name])

    def _refresh_low_precision(self, param, value) -> None:
        """The module's own (bf16/fp16, possibly partitioned) copy of a parameter follows the
        fp32 master weights."""
        deepspeed = deepspeed_package()

        if hasattr(param, "ds_id"):
            with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
                with torch.no_grad():
                    param.copy_(value.to(param.dtype))
        else:
            with torch.no_grad():
                param.copy_(value.to(param.dtype))

    def _ensure_optimizer_state(self, optimizer, saved: dict) -> None:
        """Torch optimizers create their state at the first step; a fresh engine has none to load
        into. Create it (zeros, shaped like DeepSpeed's flat fp32 partitions) and let ZeRO link it
        to the parameters, as its first step would."""
        example = next(iter(saved.values()), {})
        keys = [k for k, v in example.items() if torch.is_tensor(v) and v.dim() > 0]
        zero = self.engine.optimizer
        # ZeRO-1/2 put their flat partitions in the torch optimizer's groups; ZeRO-3 keeps them aside
        flats = [p for g in optimizer.param_groups for p in g["params"]]
        flats += list(getattr(zero, "fp32_partitioned_groups_flat", []))
        created = False
        # a fused or capturable torch optimizer keeps its step counts on the parameters' device (a
        # CPU step stopped fused AdamW's first step after a resume: "state_steps is on cpu", found
        # on an H100 under deepspeed_stage_3); others keep them on the CPU, as torch does
        on_device = any(group.get("fused") or group.get("capturable") for group in optimizer.param_groups)
        for flat in flats:
            if not optimizer.state.get(flat):
                step = torch.tensor(0.0, device=flat.device if on_device else "cpu")
                optimizer.state[flat] = {"step": step, **{k: torch.zeros_like(flat) for k in keys}}
                created = True
        if created and hasattr(zero, "_lazy_init_hp_params_optimizer_state"):  # ZeRO 1/2 link lazily
            zero._hp_optimizer_states_linked = False
            zero._lazy_init_hp_params_optimizer_state()

    def load_optimizer_state_dict(self, model, optimizer, state: dict) -> None:
        from deepspeed.utils import safe_set_full_optimizer_state

        module, params = self._named_params()
        saved = state["state"]
        self._ensure_optimizer_state(optimizer, saved)
        step = None
        seen = set()
        for name, param in params.items():
            if id(param) in seen or name not in saved:
                continue
            seen.add(id(param))
            for key, value in saved[name].items():
                if key == "step":
                    step = value
                    continue
                safe_set_full_optimizer_state(param, value.to(self.root_device, torch.float32), key)
        if step is not None:
            for inner in optimizer.state.values():
                if "step" in inner:
                    inner["step"] = _as_live_step(step, inner["step"])
        for group, saved_group in zip(optimizer.param_groups, state.get("param_groups", [])):
            for key, value in saved_group.items():
                if key != "params":
                    group[key] = value


def _as_live_step(saved, live):
    """The saved step count in the form the live optimizer keeps it: a tensor on the live one's
    device and in its dtype (a fused optimizer refuses steps elsewhere), or a number."""
    if torch.is_tensor(live):
        return torch.as_tensor(saved).detach().clone().to(device=live.device, dtype=live.dtype)
    return float(saved)
