"""`strategy=ddp_sharded`: fairscale's OSS (optimizer state sharded across ranks) with
ShardedDataParallel (each gradient reduced to the rank that owns its optimizer shard).

fairscale's last release is 0.4.13 (2022) and torch FSDP has replaced it (Lightning removed its
fairscale strategies in 2.0); it is here for users with existing fairscale set-ups.
`fairscale` is imported only when this strategy is chosen.
"""
from __future__ import annotations

import inspect
from contextlib import nullcontext

import torch

from framework.config.types import NonNegativeInt
from framework.construction.prepare import checkpoint_activations, convert_precision
from framework.strategy.abilities import Abilities
from framework.strategy.layout import StateLayout
from framework.strategy.parallel import ParallelStrategy


class DDPShardedStrategy(ParallelStrategy):
    """ZeRO-1/2-style sharding with fairscale. Gradients are zeroed in place, never set to None:
    with ShardedDataParallel's reduce buckets, `zero_grad(set_to_none=True)` (torch 2's default)
    detaches parameters from their bucket views and silently corrupts gradients from the second
    step on. This strategy is tested to match ddp bit for bit."""

    name = "ddp_sharded"
    replica_groups_refusal = ("fairscale's sharded optimizer (OSS) keeps each rank's optimizer state in its own "
                              "layout and broadcasts the weights itself after each step: torchft's heal works on "
                              "torch's own layouts")
    shards_states = True
    states = StateLayout("optimizer_sharded")
    requires_packages = {"fairscale": "'framework[fairscale]'"}
    # one optimizer driven by its wrapper; OSS shards the optimizer by its own numbering
    # (checkpoint_io=dcp gets full state from rank zero); not compiled
    abilities = Abilities(manual_optimization=False, sharded_state=False, compile=False)

    def __init__(self, *args, reduce_buffer_size: NonNegativeInt = 8388608, broadcast_buffers: bool = True,
                 timeout_s: float = 1800.0, **kwargs):
        """reduce_buffer_size: bytes per gradient reduce bucket (0: reduce each gradient alone);
        broadcast_buffers: copy rank zero's buffers (e.g. BatchNorm statistics) before each
        forward; timeout_s: how long a collective may wait."""
        super().__init__(*args, timeout_s=timeout_s, **kwargs)
        self.reduce_buffer_size = reduce_buffer_size
        self.broadcast_buffers = broadcast_buffers
        self._param_names: list[str] = []

    def setup(self, model, optimizer_factory):
        from fairscale.nn.data_parallel import ShardedDataParallel
        from fairscale.optim import OSS

        model = convert_precision(model, self.precision, self.is_global_zero).to(self.root_device)
        checkpoint_activations(model, self.units, self.loop_settings.activation_checkpointing, self.is_global_zero)
        # OSS builds one optimizer per shard from a class, its defaults and the parameter groups; read
        # them off the configured optimizer built once over the model (no state before a step): its
        # groups (weight decay and none: framework/tasks/decay.py) are OSS's
        probe = optimizer_factory(model.parameters())
        accepted = inspect.signature(type(probe).__init__).parameters
        defaults = {k: v for k, v in probe.defaults.items() if k in accepted}
        groups = [{k: v for k, v in group.items() if k == "params" or k in accepted} for group in probe.param_groups]
        optimizer = OSS(groups, optim=type(probe), **defaults)
        # the consolidated state numbers parameters group by group, as torch's state_dict does
        named = {id(p): name for name, p in model.named_parameters()}
        self._param_names = [named[id(p)] for group in groups for p in group["params"]]
        wrapped = ShardedDataParallel(model, optimizer, reduce_buffer_size=self.reduce_buffer_size,
                                      broadcast_buffers=self.broadcast_buffers)
        return wrapped, optimizer

    def no_backward_sync(self, model, skip: bool):
        return model.no_sync() if skip else nullcontext()

    def clip_gradients(self, model, optimizer, max_norm=None, max_value=None, parameters=None):
        """Each rank holds reduced gradients only for the parameters its shard owns. The global
        norm is computed the way torch.nn.utils.clip_grad_norm_ does (the norm of the vector of
        per-parameter norms, in parameter order), each entry coming from the owning rank, so
        clipping matches ddp bit for bit (fairscale's own OSS.clip_grad_norm sums squares per
        shard and rounds differently)."""
        if max_norm is None and max_value is None:
            return None
        self.precision.unscale_gradients(optimizer)
        owned = {id(p) for p in optimizer._local_params}  # fairscale 0.4.x: this rank's shard
        params = [p for p in model.parameters() if p.grad is not None]
        mine = [p for p in params if id(p) in owned]
        if max_value is not None:
            torch.nn.utils.clip_grad_value_(mine, max_value)
        if max_norm is None:
            return None
        norms = torch.zeros(len(params), dtype=params[0].grad.dtype, device=self.root_device)
        for i, p in enumerate(params):
            if id(p) in owned:
                norms[i] = torch.linalg.vector_norm(p.grad)
        total = torch.linalg.vector_norm(self.reduce(norms, "sum"))
        torch.nn.utils.clip_grads_with_norm_(mine, max_norm, total)
        return total

    def zero_grad(self, optimizer) -> None:
        optimizer.zero_grad(set_to_none=False)

    # ---- checkpoint state: OSS numbers parameters; the portable format names them ----------
    def model_state_dict(self, model) -> dict:
        return super().model_state_dict(self.unwrap(model))  # torch does not know fairscale's wrapper

    def load_model_state_dict(self, model, state: dict) -> None:
        super().load_model_state_dict(self.unwrap(model), state)

    def optimizer_state_dict(self, model, optimizer) -> dict:
        optimizer.consolidate_state_dict(recipient_rank=0)  # collective
        if not self.is_global_zero:
            return {}
        by_index = optimizer.state_dict()
        names = self._param_names
        return {"state": {names[i]: v for i, v in by_index["state"].items()},
                "param_groups": [{**{k: v for k, v in g.items() if k != "params"},
                                  "params": [names[i] for i in g["params"]]} for g in by_index["param_groups"]]}

    def load_optimizer_state_dict(self, model, optimizer, state: dict) -> None:
        index = {name: i for i, name in enumerate(self._param_names)}
        optimizer.load_state_dict({
            "state": {index[name]: v for name, v in state["state"].items()},
            "param_groups": [{**{k: v for k, v in g.items() if k != "params"},
                              "params": [index[n] for n in g["params"]]} for g in state["param_groups"]],
        })
