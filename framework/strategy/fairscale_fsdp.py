"""`strategy=fairscale_fsdp`: fairscale's FullyShardedDataParallel (CUDA only).

fairscale's FSDP creates CUDA streams when it starts, so it cannot run on a CPU-only machine; the
compatibility table refuses it there before any process starts and points to `strategy=fsdp`
(torch's own FSDP2, which runs everywhere and is the maintained successor)."""
from __future__ import annotations

from contextlib import nullcontext

import torch

from framework.construction.named_state import strict_load
from framework.strategy.abilities import Abilities
from framework.strategy.layout import StateLayout
from framework.strategy.parallel import ParallelStrategy


class FairscaleFSDPStrategy(ParallelStrategy):
    """Shards parameters, gradients and optimizer state with fairscale's FSDP; the whole model is
    one unit unless `auto_wrap_modules` names classes to wrap separately."""

    name = "fairscale_fsdp"
    replica_groups_refusal = ("fairscale keeps the parameters flattened in buffers of its own and reduces the "
                              "gradients in its own hooks: torchft's average and heal work on torch's own layouts")
    shards_states = True
    requires_packages = {"fairscale": "'framework[fairscale]'"}
    # one optimizer driven by its wrapper; no DTensor view (checkpoint_io=dcp gets full state from rank
    # zero); its flat parameters are not compiled; it needs CUDA
    abilities = Abilities(manual_optimization=False, sharded_state=False, compile=False, requires_cuda=True,
                          collective_forward=True)

    def __init__(self, *args, auto_wrap_modules: list[str] | None = None, reshard_after_forward: bool = True,
                 cpu_offload: bool = False, timeout_s: float = 1800.0, **kwargs):
        """auto_wrap_modules: class names of modules wrapped as their own FSDP units;
        reshard_after_forward: free full parameters after forward; cpu_offload: keep parameters
        on the CPU between uses (needs mixed precision); timeout_s: collective timeout."""
        super().__init__(*args, timeout_s=timeout_s, **kwargs)
        self.auto_wrap_modules = list(auto_wrap_modules or [])
        self.reshard_after_forward = reshard_after_forward
        self.cpu_offload = cpu_offload


    @property
    def states(self) -> StateLayout:  # type: ignore[override]
        return StateLayout("fully_sharded", offload=self.cpu_offload)
    def _fsdp_kwargs(self) -> dict:
        dtypes = self.precision.sharded_param_dtypes()
        return {"reshard_after_forward": self.reshard_after_forward, "move_params_to_cpu": self.cpu_offload,
                "mixed_precision": dtypes is not None and dtypes[0] == torch.float16,
                "compute_device": self.root_device}

    def wrap_model(self, model):
        from fairscale.nn.data_parallel import FullyShardedDataParallel as FSDP

        kwargs = self._fsdp_kwargs()
        for child in list(model.modules()):
            for attr, grandchild in list(child.named_children()):
                if type(grandchild).__name__ in self.auto_wrap_modules:
                    setattr(child, attr, FSDP(grandchild, **kwargs))
        return FSDP(model, **kwargs)

    def no_backward_sync(self, model, skip: bool):
        return model.no_sync() if skip else nullcontext()

    def clip_gradients(self, model, optimizer, max_norm=None, max_value=None, parameters=None):
        _gradients_in_parameter_dtype(optimizer)  # the loop calls this before every step, clipping or not
        if max_norm is None and max_value is None:
            return None
        self.precision.unscale_gradients(optimizer)
        if max_value is not None:
            torch.nn.utils.clip_grad_value_([p for p in model.parameters() if p.grad is not None], max_value)
        return model.clip_grad_norm_(max_norm) if max_norm is not None else None

    def model_state_dict(self, model) -> dict:
        state = model.state_dict()  # fairscale's FSDP gathers the full state on state_dict()
        return {k: v.detach().cpu() for k, v in state.items()} if self.is_global_zero else {}

    def load_model_state_dict(self, model, state: dict) -> None:
        model.load_state_dict(state, strict=strict_load(model, state))

    def optimizer_state_dict(self, model, optimizer) -> dict:
        _size_unsharded_buffers(model)
        # fairscale turns each live `step` tensor into an int in place (it edits the dicts that
        # optimizer.state_dict() shares with optimizer.state), and torch's Adam refuses to step on
        # an int ("`state_steps` argument must contain a list of singleton tensors": every step
        # after the first save died, measured on an H100): the live steps are put back
        steps = {id(state): state["step"] for state in optimizer.state.values() if "step" in state}
        try:
            full = model.gather_full_optim_state_dict(optimizer)
        finally:
            for state in optimizer.state.values():
                if id(state) in steps:
                    state["step"] = steps[id(state)]
        return full or {}

    def load_optimizer_state_dict(self, model, optimizer, state: dict) -> None:
        optimizer.load_state_dict(model.get_shard_from_optim_state_dict(state))


def _size_unsharded_buffers(model) -> None:
    """fairscale sizes its optimizer-state gather by each flat parameter's `_full_param_padded`, a
    buffer it makes only when it shards the parameter (world size > 1): on one GPU every
    checkpoint save died with "'FlatParameter' object has no attribute '_full_param_padded'"
    (measured on an H100, devices=1). An unsharded parameter's gather is the parameter itself: a
    meta tensor of its size stands in for the buffer (only its size is read)."""
    from fairscale.nn.data_parallel import FullyShardedDataParallel as FSDP

    for module in model.modules():
        if isinstance(module, FSDP):
            for param in module.params:
                if not getattr(param, "_is_sharded", True) and not hasattr(param, "_full_param_padded"):
                    param._full_param_padded = torch.empty(param.data.numel(), device="meta")


def _gradients_in_parameter_dtype(optimizer) -> None:
    """fairscale's mixed precision casts a gradient to its fp32 master parameter's dtype only on
    the sharded path: on one GPU (unsharded) it recasts a temporary `.data` view and the fp16
    gradient stays (GradScaler: "Attempting to unscale FP16 gradients", measured on an H100 at
    devices=1, precision=16). Cast in clip_gradients, before the unscale and the step; a no-op when
    sharded."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None and param.grad.dtype != param.dtype:
                param.grad = param.grad.to(param.dtype)
