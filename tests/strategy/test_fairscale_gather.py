"""fairscale_fsdp's optimizer-state gather at one process (framework/strategy/fairscale_fsdp.py
`_size_unsharded_buffers`): unsharded, fairscale has no `_full_param_padded` to size its gather by,
and every checkpoint save died (measured on an H100, devices=1). fairscale's FSDP cannot train on a
CPU-only torch, but its gather runs here with the compute device set to the CPU: the state the
strategy hands a checkpoint is a plain Adam's, per original parameter (without the sizing, the
same AttributeError as on the H100)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("fairscale")

SCRIPT = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
    dist.init_process_group("gloo", rank=0, world_size=1)
    from fairscale.nn.data_parallel import FullyShardedDataParallel as FSDP
    from framework.strategy.fairscale_fsdp import FairscaleFSDPStrategy

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))

    wrapped = FSDP(model(), mixed_precision=False, flatten_parameters=True, compute_device=torch.device("cpu"))
    plain = model()
    optimizers = [torch.optim.Adam(m.parameters(), lr=0.1) for m in (wrapped, plain)]
    for step in range(2):
        for m, optimizer in zip((wrapped, plain), optimizers):
            for p in m.parameters():  # each element's gradient from its own value: the flat parameter's too
                p.grad = p.detach() * (step + 1) + 0.5
            optimizer.step()
    # fairscale gathers every key into one buffer and keeps `buffer.cpu()`: on a GPU a copy, on the
    # CPU the buffer itself, so here each key would end holding the last one's values. While the
    # state is gathered, `.cpu()` of a CPU tensor copies, as it does from a GPU.
    to_host = torch.Tensor.cpu
    torch.Tensor.cpu = lambda self, *args, **kwargs: self.clone() if self.device.type == "cpu" else to_host(self, *args, **kwargs)
    try:
        full = FairscaleFSDPStrategy().optimizer_state_dict(wrapped, optimizers[0])
    finally:
        torch.Tensor.cpu = to_host
    expected = optimizers[1].state_dict()["state"]
    assert sorted(full["state"]) == sorted(expected), (sorted(full["state"]), sorted(expected))
    for index, state in expected.items():  # every value, per original parameter: plain Adam's
        for key in ("exp_avg", "exp_avg_sq"):
            assert full["state"][index][key].shape == state[key].shape, (index, key)
            assert torch.equal(full["state"][index][key], state[key]), (index, key)
        assert not torch.equal(state["exp_avg"], state["exp_avg_sq"])  # the two are told apart
        assert float(full["state"][index]["step"]) == float(state["step"]) == 2.0
    # the live state keeps its step tensors (fairscale turned them into ints in place, and Adam
    # refused its next step: measured on an H100): the training goes on and matches plain Adam's
    assert all(torch.is_tensor(state["step"]) for state in optimizers[0].state.values())
    for m, optimizer in zip((wrapped, plain), optimizers):
        for p in m.parameters():
            p.grad = p.detach() * 3 + 0.5
        optimizer.step()
    flat = torch.cat([p.detach().reshape(-1) for p in plain.parameters()])
    assert torch.equal(next(wrapped.parameters()).detach()[:flat.numel()], flat)
    print("GATHERED", len(full["state"]))
""")


@pytest.mark.slow  # a fresh interpreter or a pool of processes (make test-fast starts none)
def test_the_unsharded_optimizer_state_gathers_at_one_process():
    from tests.helpers.torchrun import free_port

    env = {**__import__("os").environ, "PORT": str(free_port())}
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert "GATHERED 4" in result.stdout, result.stdout + result.stderr[-3000:]


def test_fp16_gradients_of_fp32_parameters_are_cast_before_the_step():
    """On one GPU fairscale's mixed precision leaves fp16 gradients on the fp32 master parameters
    (GradScaler refused to unscale them, measured on an H100): the strategy casts them first."""
    import torch

    from framework.strategy.fairscale_fsdp import _gradients_in_parameter_dtype

    weight = torch.nn.Parameter(torch.ones(3))
    if hasattr(weight, "grad_dtype"):
        weight.grad_dtype = None  # newer torch checks a gradient's dtype on assignment; fairscale's has none
    weight.grad = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float16)
    optimizer = torch.optim.SGD([weight], lr=1.0)
    _gradients_in_parameter_dtype(optimizer)
    assert weight.grad.dtype == torch.float32 and weight.grad.tolist() == [0.5, -1.0, 2.0]
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0)
    scaler.scale(torch.ones(()))  # the scale exists once a loss was scaled
    scaler.unscale_(optimizer)  # refused with fp16 gradients ("Attempting to unscale FP16 gradients")
    assert weight.grad.tolist() == [0.25, -0.5, 1.0]
