"""Contract test suites for plugins: run them against your own class to check it keeps the
promises the runner and the loop rely on. The built-in plugins run the same suites
(tests/test_contracts.py).

    >>> from framework.testing import check_strategy
    >>> check_strategy(MyDDP)                   # e.g. in a pytest test of your plugin package

Each `check_*` raises AssertionError naming the broken promise, and returns nothing. They need
no GPU: a strategy is checked on the CPU in one process (with a one-process gloo group when it is
a multi-process strategy), which exercises every method the loop calls.
"""
from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from framework.accelerator.cpu import CPUAccelerator
from framework.errors import CheckpointError, ConfigError
from framework.strategy.base import LoopSettings

__all__ = ["check_accelerator", "check_precision", "check_checkpoint_io", "check_cluster_environment",
           "check_strategy"]


def _require(condition: bool, promise: str) -> None:
    if not condition:
        raise AssertionError(promise)


def _instance(plugin, **kwargs):
    return plugin(**kwargs) if isinstance(plugin, type) else plugin


def _tiny_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g)


# ---- accelerator -------------------------------------------------------------------------------
def check_accelerator(accelerator) -> None:
    """Availability is a plain bool; when available: at least one device, `auto` resolves to a
    count, each local rank gets a torch.device, a collective backend is named."""
    acc = _instance(accelerator)
    _require(isinstance(acc.name, str) and acc.name != "base", "an accelerator has its own `name`")
    available = acc.is_available()
    _require(isinstance(available, bool), "is_available() returns a bool")
    if not available:
        _require(isinstance(acc.unavailable_reason(), str) and acc.unavailable_reason(),
                 "an unavailable accelerator says why (unavailable_reason)")
        return
    _require(acc.max_devices() >= 1, "max_devices() is at least 1 when available")
    _require(1 <= acc.resolve_devices("auto") <= acc.max_devices(), "devices=auto resolves within max_devices()")
    _require(acc.resolve_devices(1) == 1, "an integer `devices` resolves to itself")
    device = acc.device_for(0)
    _require(isinstance(device, torch.device), "device_for(local_rank) returns a torch.device")
    acc.setup_device(device)
    _require(isinstance(acc.distributed_backend, str) and acc.distributed_backend, "distributed_backend is named")
    memory = acc.memory_bytes()
    _require(memory is None or (isinstance(memory, int) and memory > 0), "memory_bytes() is None or positive")
    torch.ones(2, device=device).sum().item()  # the device computes


# ---- precision ---------------------------------------------------------------------------------
def check_precision(precision, device_type: str = "cpu") -> None:
    """A training step through the precision plugin lowers the loss of a tiny model, gradients
    end up unscaled and finite, clipping bounds the norm, and its state round-trips."""
    prec = _instance(precision)
    _require(isinstance(prec.name, str), "a precision has a `name`")
    prec.setup(device_type)
    model = prec.convert_module(_tiny_model())
    trainable = [p for p in model.parameters() if p.requires_grad]  # a quantized precision freezes some
    _require(trainable and all(p.dtype == prec.param_dtype for p in trainable if p.is_floating_point()),
             "convert_module leaves the trainable parameters in param_dtype")
    optimizer = torch.optim.SGD(trainable, lr=0.1)
    x, y = _batch()
    x = prec.convert_input(x)

    def loss_now():
        with prec.forward_context():
            return torch.nn.functional.cross_entropy(model(x).float(), y)

    before = loss_now().item()
    for _ in range(5):
        loss = loss_now()
        prec.backward(loss)
        norm = prec.clip_gradients(trainable, optimizer, max_norm=1.0)
        _require(all(p.grad is not None and torch.isfinite(p.grad).all() for p in trainable),
                 "gradients are finite after backward and unscaling")
        if norm is not None and torch.isfinite(torch.as_tensor(norm)):
            total = torch.linalg.vector_norm(torch.stack([p.grad.float().norm() for p in trainable]))
            _require(total <= 1.0 + 1e-2, "clip_gradients(max_norm=1) bounds the global norm")
        stepped = prec.optimizer_step(optimizer)
        _require(isinstance(stepped, bool), "optimizer_step returns whether the step was taken")
        optimizer.zero_grad(set_to_none=True)
    _require(loss_now().item() < before, "five steps through the precision plugin lower the loss")
    state = prec.state_dict()
    _require(isinstance(state, dict), "state_dict() is a dict")
    fresh = _instance(type(prec)) if isinstance(precision, type) else prec
    fresh.load_state_dict(state)


# ---- checkpoint io -----------------------------------------------------------------------------
def check_checkpoint_io(checkpoint_io, directory: str | os.PathLike | None = None) -> None:
    """save/load round-trips nested tensors and plain values bit for bit, overwrites atomically,
    and a missing file is a CheckpointError."""

    io = _instance(checkpoint_io)
    _require(isinstance(io.name, str), "a checkpoint_io has a `name`")
    with contextlib.ExitStack() as stack:
        root = Path(directory) if directory else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        obj = {"weights": {"a": torch.randn(3, 4), "b": torch.arange(5)}, "step": 7, "names": ["x", "y"],
               "bf16": torch.randn(2, dtype=torch.float64).to(torch.bfloat16)}
        path = root / "sub" / "state.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        io.save(obj, path)
        io.wait()
        _require(not io.pending(), "pending() is False after wait()")
        loaded = io.load(path)
        _require(loaded["step"] == 7 and loaded["names"] == ["x", "y"], "plain values round-trip")
        for key in ("a", "b"):
            _require(torch.equal(loaded["weights"][key], obj["weights"][key]), f"tensor {key} round-trips exactly")
        _require(loaded["bf16"].dtype == torch.bfloat16 and torch.equal(loaded["bf16"], obj["bf16"]),
                 "dtypes round-trip")
        io.save({"step": 8}, path)  # overwrite
        io.wait()
        _require(io.load(path)["step"] == 8, "a second save to the same path replaces the first")
        leftovers = [p.name for p in path.parent.iterdir() if p.name != path.name]
        _require(not leftovers, f"no temporary files are left beside the checkpoint: {leftovers}")
        io.remove(path)
        _require(not path.exists(), "remove() deletes the file")
        try:
            io.load(root / "missing.pt")
        except CheckpointError:
            pass
        else:
            raise AssertionError("loading a missing file raises CheckpointError")


# ---- cluster environment -----------------------------------------------------------------------
@contextlib.contextmanager
def _environment(variables: dict[str, str]):
    saved = dict(os.environ)
    os.environ.update(variables)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def check_cluster_environment(environment, variables: dict[str, str], devices: int, num_nodes: int) -> None:
    """Under `variables` (what the scheduler sets for one process): the environment detects itself
    (or is explicit-only), reports consistent ranks and a main address and port, accepts the
    matching devices/num_nodes and refuses a mismatch with a ConfigError."""

    with _environment(variables):
        env = _instance(environment)
        _require(isinstance(env.name, str) and env.name != "base", "an environment has its own `name`")
        _require(isinstance(type(env).detect(), bool), "detect() returns a bool")
        world, rank, local, node = env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()
        _require(all(isinstance(v, int) for v in (world, rank, local, node)), "ranks are ints")
        _require(0 <= rank < world and 0 <= local < devices and 0 <= node < num_nodes,
                 "0 <= global_rank < world_size, local_rank < devices, node_rank < num_nodes")
        _require(world == devices * num_nodes, "world_size == devices x num_nodes")
        _require(isinstance(env.main_address, str) and env.main_address, "main_address is a host name")
        _require(isinstance(env.main_port, int) and 0 < env.main_port < 65536, "main_port is a port number")
        _require(isinstance(env.creates_processes_externally, bool), "creates_processes_externally is a bool")
        env.validate(devices, num_nodes)
        try:
            env.validate(devices + 1, num_nodes)
        except ConfigError:
            pass
        else:
            raise AssertionError("validate() refuses devices that disagree with the environment (ConfigError)")


# ---- strategy ----------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _one_process_group(needed: bool):
    if not needed or dist.is_initialized():
        yield
        return
    variables = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0", "WORLD_SIZE": "1",
                 "LOCAL_RANK": "0"}
    with _environment(variables):
        try:
            yield
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


def _reference_steps(steps: int) -> torch.nn.Module:
    model = _tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(steps):
        x, y = _batch(step)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model


def check_strategy(strategy: Callable[..., Any], steps: int = 3, **kwargs) -> None:
    """The loop's whole surface on the CPU, in one process: setup, a frozen second model placed in
    eval mode, batches, forward/backward, clipping, optimizer steps (the weights equal plain
    PyTorch's after `steps` AdamW steps), the collectives at world size 1, and a full state dict
    that loads into a fresh instance."""

    def make():
        return strategy(accelerator=CPUAccelerator(), **kwargs)

    probe = make()
    _require(isinstance(probe.name, str) and probe.name != "base", "a strategy has its own `name`")
    _require(isinstance(probe.multi_process, bool), "multi_process is a bool")
    with _one_process_group(probe.multi_process):
        first = make()
        first.configure_loop(LoopSettings(micro_batch_size=6, accumulate=1, clip_grad_norm=None))
        first.setup_environment()
        second = None
        try:
            model, optimizer = first.setup(_tiny_model(), lambda params: torch.optim.AdamW(params, lr=1e-2))
            frozen = first.place_frozen(lambda: torch.nn.Sequential(_tiny_model(seed=2), torch.nn.Dropout(0.5)))
            _require(not any(m.training for m in first.unwrap(frozen).modules()),
                     "place_frozen gives the second model (a reference, a teacher) in eval mode: its dropout off")
            _require(not any(p.requires_grad for p in frozen.parameters()), "place_frozen's model trains nothing")
            for step in range(steps):
                x, y = first.batch_to_device(_batch(step))
                with first.no_backward_sync(model, skip=False), first.forward_context():
                    loss = torch.nn.functional.cross_entropy(model(x).float(), y)
                first.backward(loss)
                first.clip_gradients(model, optimizer, max_norm=1e6)
                _require(first.optimizer_step(optimizer) is not False, "optimizer_step takes the step")
                first.zero_grad(optimizer)
            state = first.model_state_dict(model)
            reference = _reference_steps(steps).state_dict()
            _require(set(state) == set(reference), f"model_state_dict keys are the plain module's names: {sorted(state)}")
            for name, tensor in reference.items():
                _require(torch.allclose(state[name].float().cpu(), tensor, atol=1e-5),
                         f"after {steps} steps, {name} equals plain PyTorch's")
            optimizer_state = first.optimizer_state_dict(model, optimizer)
            _require(isinstance(optimizer_state, dict) and optimizer_state.get("state"),
                     "optimizer_state_dict holds the optimizer's state")
            _require(first.world_size == 1 and first.global_rank == 0 and first.is_global_zero,
                     "ranks at world size 1")
            _require(torch.equal(first.reduce(torch.tensor([2.0]), "sum"), torch.tensor([2.0])),
                     "reduce at world size 1")
            _require(first.all_gather(torch.tensor([3.0])).shape == (1, 1), "all_gather stacks ranks")
            _require(first.broadcast({"a": 1}) == {"a": 1}, "broadcast returns the object")
            first.barrier()
            # a second instance in the same process group (a resumed run) loads that state
            second = make()
            second.configure_loop(LoopSettings(micro_batch_size=6))
            second.setup_environment()
            fresh, fresh_optimizer = second.setup(_tiny_model(seed=5), lambda params: torch.optim.AdamW(params, lr=1e-2))
            keys = sorted(state)
            second.load_model_state_dict(fresh, state)
            second.load_optimizer_state_dict(fresh, fresh_optimizer, optimizer_state)
            _require(sorted(state) == keys and all(type(v) is torch.Tensor for v in state.values()),
                     "loading a state dict leaves the caller's dict as it was")
            again = second.model_state_dict(fresh)
            for name, tensor in state.items():
                _require(torch.equal(again[name].cpu(), tensor.cpu()), f"{name} survives a state round trip")
        finally:
            if second is not None:
                second.teardown()
            first.teardown()
