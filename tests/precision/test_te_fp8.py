"""precision=te_fp8 (TransformerEngine) as far as a machine without an fp8 GPU can check it: which
layers it would take over, the refusals before launch (no fp8 GPU, no transformer_engine, a
strategy that manages precision itself), and its scaling state dropped for a model without it.
Its runs are in `make gpu-check` (benchmarks/gpu_check.py)."""
from __future__ import annotations

import pytest
import torch

from framework.checkpoint.weights import fit_saved_state
from framework.config.compatibility import judge
from framework.errors import ConfigError
from framework.models.gpt import GPT
from framework.precision.te_fp8 import TransformerEngineFP8Precision
from framework.preflight import compatibility_plan, prepare
from tests.conftest import TINY_GPT, compose_cfg


def test_layers_taken_over_are_fp8_sized_linears_and_layernorms():
    model = GPT(vocab_size=250, n_layer=1, n_embd=32, n_head=2, block_size=16)  # head 32 -> 250: not a multiple of 16
    chosen, kept = TransformerEngineFP8Precision().plan_layers(model)
    assert chosen == ["blocks.0.ln1", "blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.ln2", "blocks.0.mlp.0",
                      "blocks.0.mlp.2", "ln_f"]
    assert kept == ["head (32x250: fp8 needs multiples of 16)"]
    small = torch.nn.Sequential(torch.nn.Linear(10, 3))
    assert TransformerEngineFP8Precision().model_problems(small) == [
        "precision=te_fp8: the model has no torch.nn.Linear layer whose dimensions are multiples of 16, so nothing "
        "would compute in fp8; use precision=bf16."]


def test_options_are_checked():
    with pytest.raises(ConfigError, match="precision.fp8_format='E5M2': use one of HYBRID, E4M3"):
        TransformerEngineFP8Precision(fp8_format="E5M2")
    with pytest.raises(ConfigError, match="precision.weights_dtype='fp16': use one of fp32, bf16"):
        TransformerEngineFP8Precision(weights_dtype="fp16")


def test_refused_on_this_cpu_with_the_reason():
    problems = prepare(compose_cfg([*TINY_GPT, "precision=te_fp8"]), strict=False).problems
    assert ("precision=te_fp8 on accelerator=cpu: accelerator=cpu has no fp8 matmuls. TransformerEngine's fp8 needs "
            "accelerator=cuda on a GPU of compute capability 8.9 or later; use precision=bf16 here.") in problems


class _FakeGPU:
    """What the table reads of a CUDA accelerator, for a GPU with or without fp8."""

    name = "cuda"

    def __init__(self, capability):
        self.capability = capability

    def is_available(self):
        return True

    def max_devices(self):
        return 8

    def supports_bf16(self):
        return True

    def fast_fp16(self):
        return True

    def fp8_support(self):
        return None if self.capability >= (8, 9) else f"A100 has compute capability {self.capability[0]}.0; ..."


@pytest.mark.parametrize("capability,strategy,refused", [
    ((9, 0), "ddp", None),
    ((8, 0), "ddp", "precision=te_fp8 on accelerator=cuda: A100 has compute capability 8.0"),
    ((9, 0), "deepspeed_stage_2", "precision=te_fp8 with strategy=deepspeed_stage_2: only single_device, ddp"),
])
def test_the_table_on_gpus_with_and_without_fp8(capability, strategy, refused):
    prepared = prepare(compose_cfg([*TINY_GPT, "precision=te_fp8", f"strategy={strategy}", "devices=2"]),
                       strict=False)
    plan = compatibility_plan(prepared.plugins, prepared.resolved, 2)
    plan.accelerator = _FakeGPU(capability)
    te_rules = [m for m in judge(plan)[0] if m.startswith("precision=te_fp8") and "package" not in m]
    assert (te_rules[0].startswith(refused) if refused else te_rules == []), te_rules


def test_its_fp8_scaling_state_is_dropped_for_a_model_without_it():
    model = GPT(n_layer=1, n_embd=32, n_head=2, block_size=16)
    state = {**model.state_dict(), "blocks.0.attn.qkv._extra_state": torch.tensor([1, 2], dtype=torch.uint8)}
    fitted = fit_saved_state(model, state)
    assert "blocks.0.attn.qkv._extra_state" not in fitted and set(fitted) == set(model.state_dict())
