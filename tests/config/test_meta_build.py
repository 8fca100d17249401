"""The config check builds the model on the meta device without running its initialisers (which
on meta tensors import torch._dynamo and sympy), and still catches constructor errors."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from framework.construction.meta_build import meta_device
from framework.models.gpt import GPT
from tests.conftest import ROOT


def test_shapes_are_those_of_the_real_model():
    with meta_device():
        meta = GPT(n_layer=1, n_embd=32, n_head=2, block_size=16)
    real = GPT(n_layer=1, n_embd=32, n_head=2, block_size=16)
    assert all(p.is_meta for p in meta.parameters())
    assert {k: v.shape for k, v in meta.state_dict().items()} == {k: v.shape for k, v in real.state_dict().items()}
    assert not torch.empty(2).is_meta  # the mode ends with the block


def test_constructor_errors_still_surface():
    with pytest.raises(Exception, match="n_head"):
        with meta_device():
            GPT(n_embd=30, n_head=4)


@pytest.mark.slow  # a fresh interpreter or a pool of processes (make test-fast starts none)
def test_no_dynamo_import():
    code = ("import sys; from framework.construction.meta_build import meta_device; from framework.models.gpt import GPT\n"
            "with meta_device(): GPT()\nprint('torch._dynamo' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.stdout.strip() == "False", result.stderr
