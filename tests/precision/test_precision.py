"""Each precision does what its name claims: dtypes, autocast, loss scaling, clipping."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from framework.precision.bf16_mixed import BF16MixedPrecision
from framework.precision.bf16_true import BF16TruePrecision
from framework.precision.fp16_mixed import FP16MixedPrecision
from framework.precision.fp16_true import FP16TruePrecision
from framework.precision.fp32 import FP32Precision
from framework.precision.fp64 import FP64Precision

# precision -> (parameter dtype, dtype of a Linear's output in the forward context)
EXPECTED = {
    FP32Precision: (torch.float32, torch.float32),
    FP64Precision: (torch.float64, torch.float64),
    FP16MixedPrecision: (torch.float32, torch.float16),
    BF16MixedPrecision: (torch.float32, torch.bfloat16),
    FP16TruePrecision: (torch.float16, torch.float16),
    BF16TruePrecision: (torch.bfloat16, torch.bfloat16),
}


@pytest.mark.parametrize("cls", list(EXPECTED), ids=lambda c: c.name)
def test_dtypes(cls):
    param_dtype, compute_dtype = EXPECTED[cls]
    precision = cls()
    precision.setup("cpu")
    model = precision.convert_module(nn.Linear(4, 3))
    assert model.weight.dtype == param_dtype
    x, labels = precision.convert_input((torch.randn(2, 4), torch.tensor([1, 2])))
    assert labels.dtype == torch.int64  # integer inputs are never cast
    with precision.forward_context():
        out = model(x)
        created = torch.zeros(1)
    assert out.dtype == compute_dtype
    if param_dtype != torch.float32:  # true precisions make new tensors in their dtype too
        assert created.dtype == param_dtype
    assert torch.get_default_dtype() == torch.float32  # restored afterwards


def test_fp16_scaler_skips_an_overflowing_step_and_halves_the_scale():
    precision = FP16MixedPrecision(init_scale=1024.0)
    precision.setup("cpu")
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.weight.detach().clone()
    with precision.forward_context():
        loss = model(torch.randn(2, 3)).float().sum()
    precision.backward(loss)
    model.weight.grad[0, 0] = float("inf")
    assert precision.optimizer_step(opt) is False
    assert torch.equal(model.weight, before)
    assert precision.loss_scale == 512.0
    # a clean step is taken and moves the weights
    opt.zero_grad()
    with precision.forward_context():
        loss = model(torch.randn(2, 3)).float().sum()
    precision.backward(loss)
    assert precision.optimizer_step(opt) is True
    assert not torch.equal(model.weight, before)


def test_fp16_scaler_state_round_trips():
    a = FP16MixedPrecision(init_scale=256.0)
    a.setup("cpu")
    b = FP16MixedPrecision()
    b.setup("cpu")
    b.load_state_dict(a.state_dict())
    assert b.loss_scale == 256.0


def _model_with_grads():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1))
    (model(torch.randn(16, 8)).sum() * 100).backward()
    return model


def test_clip_by_norm_bounds_the_global_norm():
    model = _model_with_grads()
    precision = FP32Precision()
    norm_before = precision.clip_gradients(model.parameters(), None, max_norm=0.5)
    norm_after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert norm_before > 0.5
    assert norm_after == pytest.approx(0.5, rel=1e-4)


def test_clip_by_value_bounds_every_element():
    model = _model_with_grads()
    FP32Precision().clip_gradients(model.parameters(), None, max_value=0.01)
    assert max(p.grad.abs().max().item() for p in model.parameters()) <= 0.01 + 1e-9


def test_clipping_under_loss_scaling_sees_true_gradients():
    """The scaler unscales before clipping: the reported norm is the unscaled one."""
    reference = _model_with_grads()
    true_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1e9)
    precision = FP16MixedPrecision(init_scale=1024.0)
    precision.setup("cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    precision.backward(model(torch.randn(16, 8)).sum() * 100)  # scaled by 1024 inside
    assert model[1].weight.grad.abs().max() > 1000 * reference[1].weight.grad.abs().max()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    norm = precision.clip_gradients(model.parameters(), opt, max_norm=1e9)
    assert norm.item() == pytest.approx(true_norm.item(), rel=1e-5)
