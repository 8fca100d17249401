"""Every multi-process strategy trains the default model with 2 processes (gloo, CPU) and agrees
with ddp; ddp agrees with single_device on the same global batch; ddp_sharded is ddp bit for bit."""
from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import assert_state_equal, checkpoints, load_model_state, load_optimizer_state
from tests.helpers.two_ranks import STEPS, STRATEGIES, TOLERANCE, run_world, shared, train_losses

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference():
    """ddp at 2 processes, per precision."""
    return {p: train_losses(shared("ddp", p)) for p in ("32", "bf16")}


def assert_a_whole_checkpoint_of(out, strategy):
    meta = json.loads((checkpoints(out)[-1] / "meta.json").read_text())
    assert meta["world_size"] == 2 and meta["strategy"] == strategy
    model = load_model_state(checkpoints(out)[-1])
    assert "blocks.0.attn.qkv.weight" in model and model["blocks.0.attn.qkv.weight"].shape == (96, 32)


@pytest.mark.parametrize("precision", ["32", "bf16"])
@pytest.mark.matrix(strategy="ddp")
def test_the_ddp_reference_learns_and_saves_whole_weights(reference, precision):
    losses = reference[precision]
    assert len(losses) == STEPS and losses[-1] < losses[0]
    assert_a_whole_checkpoint_of(shared("ddp", precision), "ddp")


@pytest.mark.parametrize("precision", ["32", "bf16"])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.matrix
def test_strategy_matches_ddp(reference, strategy, precision):
    out = shared(strategy, precision)
    losses = train_losses(out)
    assert len(losses) == STEPS
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference[precision]),
                               rtol=TOLERANCE[precision], atol=TOLERANCE[precision])
    assert losses[-1] < losses[0]  # it learns
    assert_a_whole_checkpoint_of(out, strategy)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "deepspeed_stage_3"])
def test_activation_checkpointing_keeps_the_losses(reference, strategy):
    """Recomputing each unit's activations in backward (trainer.activation_checkpointing) trains
    the same numbers as keeping them, under every kind of strategy."""
    out = shared(strategy, extra=["trainer.activation_checkpointing=true"])
    torch.testing.assert_close(torch.tensor(train_losses(out)), torch.tensor(reference["32"]), rtol=1e-5, atol=1e-5)


@pytest.mark.matrix(strategy="ddp")
@pytest.mark.matrix(strategy="single_device")
def test_ddp_equals_single_device_on_the_same_global_batch(tmp_path):
    ddp = run_world(tmp_path, "ddp", "ddp", 2, ["data.batch_size=4"])
    single = run_world(tmp_path, "single", "single_device", 1, ["data.batch_size=8"])
    torch.testing.assert_close(torch.tensor(train_losses(ddp)), torch.tensor(train_losses(single)),
                               rtol=1e-5, atol=1e-5)
    a, b = load_model_state(checkpoints(ddp)[-1]), load_model_state(checkpoints(single)[-1])
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)


def test_ddp_sharded_is_bit_identical_to_ddp():
    """After steps with accumulation and clipping (BASE has both)."""
    a, b = checkpoints(shared("ddp"))[-1], checkpoints(shared("ddp_sharded"))[-1]
    assert a.name == b.name == f"step_{STEPS:06d}"
    assert_state_equal(load_model_state(a), load_model_state(b), "model")
    assert_state_equal(load_optimizer_state(a), load_optimizer_state(b), "optimizer")
