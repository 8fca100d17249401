"""The same job at the same thread count gives the same bits (docs/checkpoints.md, "Reproducibility"): torch's
float32 matmuls on an x86 CPU are MKL's, and every framework process puts MKL in its strict
conditional-numerical-reproducibility mode before its first call, in which a product does not
depend on where its operands lie in memory (framework/__init__.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="this torch does not use MKL")


def _mkl_mode(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    env["MKL_VERBOSE"] = "1"
    if env_value is not None:
        env["MKL_CBWR"] = env_value
    code = "import torch, framework; a = torch.randn(64, 64); a @ a"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    modes = [part for line in out.stdout.splitlines() if "SGEMM" in line for part in line.split() if
             part.startswith("CNR:")]
    assert modes, out.stdout + out.stderr
    return modes[0]


@pytest.mark.slow  # a fresh interpreter or a pool of processes (make test-fast starts none)
def test_every_framework_process_runs_mkl_in_strict_reproducible_mode():
    assert _mkl_mode(None) == "CNR:AUTO,STRICT"
    assert _mkl_mode("COMPATIBLE") == "CNR:COMPATIBLE"  # a mode the user chose is kept


def test_a_product_does_not_depend_on_where_its_operands_lie():
    torch.manual_seed(0)
    a, b = torch.randn(64, 784), torch.randn(784, 128)

    def placed(t: torch.Tensor, offset: int) -> torch.Tensor:
        buffer = torch.empty(t.numel() + 32)
        start = (16 - (buffer.data_ptr() // 4) % 16) % 16 + offset  # `offset` floats past a 64-byte boundary
        view = buffer[start:start + t.numel()].view_as(t)
        view.copy_(t)
        return view

    reference = placed(a, 0) @ placed(b, 0)
    for offset in (1, 3, 5, 7, 9, 15):
        assert torch.equal(placed(a, offset) @ placed(b, 16 - offset), reference), offset
