"""Every precision the CPU accepts trains the GPT under single_device, start to end as a user runs
it: the validation loss before the first step is float32's within what the format can hold, the loss falls, and the
checkpoint's weights are in the precision's dtype (float32 masters for the mixed ones, the true
half types, int8/uint8 for the quantized layers)."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import TINY_GPT, checkpoints, load_model_state, metric_values, run_inprocess

pytestmark = pytest.mark.slow

# |val/loss at step 0 - float32's| allowed: float64 and the mixed formats round a forward of
# the same weights, the true half types and the quantized layers also round the weights themselves
# (the quantized ones: tests/precision/test_quantized.py TOLERANCE)
PRECISIONS = {"64": 1e-4, "16": 2e-2, "bf16": 5e-2, "16_true": 2e-2, "bf16_true": 5e-2,
              "bnb_int8": 5e-2, "bnb_nf4": 0.3, "bnb_nf4_dq": 0.3, "bnb_fp4": 0.4}
WEIGHT_DTYPE = {"64": torch.float64, "16_true": torch.float16, "bf16_true": torch.bfloat16, "bnb_int8": torch.int8,
                "bnb_nf4": torch.uint8, "bnb_nf4_dq": torch.uint8, "bnb_fp4": torch.uint8}
RUN = [*TINY_GPT, "strategy=single_device", "trainer.max_steps=8", "trainer.val_every=8", "optimizer.lr=1e-2",
       "scheduler=constant", "callbacks=[checkpoint]"]


@pytest.fixture(scope="module")
def float32(tmp_path_factory):
    out = tmp_path_factory.mktemp("fp32")
    run_inprocess(RUN, out)
    return out


@pytest.mark.matrix(strategy="single_device", precision="32")
def test_float32_learns(float32):
    losses = metric_values(float32)
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.1


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.matrix(strategy="single_device")
def test_the_precision_trains_from_float32s_start(float32, precision, tmp_path):
    if precision.startswith("bnb"):
        pytest.importorskip("bitsandbytes", reason="bitsandbytes is in the dev extra; pip install 'framework[quant]'")
    run_inprocess([*RUN, f"precision={precision}"], tmp_path)
    losses, reference = metric_values(tmp_path), metric_values(float32)
    assert len(losses) == len(reference) and all(torch.isfinite(torch.tensor(losses)))
    start, reference_start = metric_values(tmp_path, "val/loss")[0], metric_values(float32, "val/loss")[0]
    assert abs(start - reference_start) <= PRECISIONS[precision], (start, reference_start)  # the same weights
    assert losses[-1] < losses[0] - 0.05, losses  # it learns
    weights = load_model_state(checkpoints(tmp_path)[-1])
    assert weights["blocks.0.attn.qkv.weight"].dtype == WEIGHT_DTYPE.get(precision, torch.float32)
