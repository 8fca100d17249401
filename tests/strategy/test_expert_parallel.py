"""Experts spread over ranks (strategy.expert_parallel_size): the built-in GPT's mixture of experts
at 2 processes, its tokens dispatched by all-to-all, gives one process's numbers on the same global
batch (losses, clipped gradient norms, the balancing loss, the bias-balanced biases), and its
checkpoint, which holds every expert under the model's names, resumes sample-exact under other
layouts."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from framework.cli import main as framework_main
from tests.conftest import (
    assert_close_metrics,
    assert_close_weights,
    checkpoint_at,
    load_model_state,
    metric_values,
    run_inprocess,
)
from tests.helpers.run_cache import trained_run
from tests.helpers.two_ranks import BASE, STEPS

pytestmark = pytest.mark.slow

# 4 experts, top-2, a shared expert, the auxiliary balancing loss and the z-loss; the model's one
# Block is the mixture of experts
MOE = ["model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.shared_experts=1", "model.moe.z_loss_coef=0.001",
       "model.moe.expert_hidden=48"]
LAYOUTS = {
    "one": ["strategy=single_device", "devices=1", "data.batch_size=16"],
    "ddp": ["strategy=ddp", "devices=2"],
    "ep2": ["strategy=fsdp", "devices=2", "strategy.expert_parallel_size=2"],
    # the routed experts whole on both tensor-parallel ranks, the tokens counted once
    "tp2": ["strategy=model_parallel", "devices=2", "data.batch_size=16"],
    # each expert on 2 of the 4 ranks: its gradient also summed over its replica
    "ep2xfsdp2": ["strategy=fsdp", "devices=4", "strategy.expert_parallel_size=2", "data.batch_size=4"],
    # each tensor-parallel slice dispatches its (identical) tokens to its own expert group
    "ep2xtp2": ["strategy=model_parallel", "devices=4", "strategy.tensor_parallel_size=2",
                "strategy.expert_parallel_size=2"],
    # 2 stages, each with its experts over 2 ranks
    "pp2xep2": ["strategy=model_parallel", "devices=4", "strategy.pipeline_parallel_size=2",
                "strategy.tensor_parallel_size=1", "strategy.expert_parallel_size=2"],
}


def run_of(layout: str, extra=()) -> object:
    return trained_run([*BASE, *MOE, *LAYOUTS[layout], *extra])


@pytest.mark.parametrize("layout", ["ddp", "ep2", "ep2xfsdp2", "tp2", "ep2xtp2"])
def test_every_layout_gives_one_processs_numbers(layout):
    """Same global batch (16): each step's loss, clipped gradient norm and balancing loss as one
    process computes them: the tokens per expert are counted over the micro-batch of every rank."""
    one, other = run_of("one"), run_of(layout)
    assert_close_metrics(other, one, ("train/loss", "train/grad_norm", "train/moe_balance_loss", "train/moe_z_loss",
                                      "train/moe_load_max/0"), STEPS)
    assert min(metric_values(other, "train/grad_norm")) > 0.5  # above the clip: the norm spans every expert
    assert_close_weights(checkpoint_at(one, STEPS), checkpoint_at(other, STEPS))


def test_the_checkpoint_holds_every_expert_under_the_models_names(tmp_path):
    state = load_model_state(checkpoint_at(run_of("ep2"), STEPS))
    assert state["blocks.0.moe.experts.w1"].shape == (4, 32, 48)
    assert state["blocks.0.moe.experts.b2"].shape == (4, 32)
    assert state["blocks.0.moe.router.weight"].shape == (4, 32)
    # each rank trained its own two experts: all four moved away from their initial zeros
    assert (state["blocks.0.moe.experts.b1"].abs().sum(dim=1) > 0).all()
    # `framework test` on the run (a copy: the shared run stays as trained), at its own layout
    run = shutil.copytree(run_of("ep2"), tmp_path / "run")
    assert framework_main(["test", str(run), "trainer.test_batches=2"]) == 0
    tested = json.loads((run / "test_metrics.json").read_text())["metrics"]["test/loss"]
    assert tested < 5.6
    # `framework predict` in one process, every expert on it: the rows score what the test scored
    assert framework_main(["predict", str(run), "trainer.test_batches=2", "strategy=single_device", "devices=1",
                           "-o", str(tmp_path / "rows.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    tokens = sum(row["tokens"] for row in rows)
    assert rows and abs(sum(row["loss"] * row["tokens"] for row in rows) / tokens - tested) < 1e-5
    # exported whole (every expert under the model's names), and generation with the KV cache
    # writes what recomputing writes
    assert framework_main(["convert", str(checkpoint_at(run, STEPS)), str(tmp_path / "w.safetensors"),
                           "--to", "safetensors"]) == 0
    from safetensors.torch import load_file

    exported = load_file(tmp_path / "w.safetensors")
    assert set(exported) == set(state) and all(torch.equal(exported[k], v) for k, v in state.items())
    written = []
    for cache in ([], ["--no-cache"]):
        out = tmp_path / f"gen{len(written)}.jsonl"
        assert framework_main(["generate", str(run), "--prompt", "def ", "--greedy", "--max-new-tokens", "12",
                               *cache, "-o", str(out)]) == 0
        written.append(json.loads(out.read_text())["completion"])
    assert written[0] == written[1] and written[0]


@pytest.mark.parametrize("into", [
    ["strategy=single_device", "devices=1", "data.batch_size=16"],
    ["strategy=ddp", "devices=2"],
    ["strategy=fsdp", "devices=2"],
], ids=["one_process", "ddp", "fsdp_without_experts_spread"])
def test_an_expert_parallel_checkpoint_resumes_sample_exact_elsewhere(tmp_path, into):
    straight = run_of("ep2")
    run_inprocess([*BASE, *MOE, *into, f"ckpt_path={checkpoint_at(straight, STEPS // 2)}"], tmp_path)
    torch.testing.assert_close(torch.tensor(metric_values(tmp_path)), torch.tensor(metric_values(straight)[STEPS // 2:]),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["ep2", "pp2xep2"])
def test_bias_balancing_moves_the_same_biases_at_every_layout(layout):
    """DeepSeek-V3's balancing without an auxiliary loss: after each step every expert's bias moves
    by bias_rate towards the experts that got fewer of the step's tokens, counted over all ranks
    (under pipeline stages, not torch's metadata-inference forward): the biases at the end are one
    process's, and they moved."""
    # one micro-batch a step (with two, this data's steps alternate and the biases come back to 0);
    # the z-loss on: under pipeline stages each stage's joins its own backward
    extra = ["model.n_layer=2", "model.moe.balance=bias", "model.moe.bias_rate=0.01", "trainer.accumulate=1"]
    one, other = run_of("one", extra), run_of(layout, extra)
    a, b = load_model_state(checkpoint_at(one, STEPS)), load_model_state(checkpoint_at(other, STEPS))
    for name in ("blocks.0.moe.expert_bias", "blocks.1.moe.expert_bias"):
        assert torch.equal(b[name], a[name]), name
        assert a[name].abs().sum() > 0 and a[name].abs().max() <= STEPS * 0.01 + 1e-6
    torch.testing.assert_close(torch.tensor(metric_values(other)), torch.tensor(metric_values(one)), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.tensor(metric_values(other, "train/grad_norm")),
                               torch.tensor(metric_values(one, "train/grad_norm")), rtol=1e-5, atol=1e-5)
    # every layer's load over the step's tokens, each stage's layers reported by its own ranks under
    # pipeline stages (their microbatches' counts summed): one process's, step by step
    for layer in (0, 1):
        busiest, idlest = (metric_values(other, f"train/moe_load_{end}/{layer}") for end in ("max", "min"))
        assert len(busiest) == len(idlest) == STEPS and min(busiest) > 1 > max(idlest), (layer, busiest, idlest)
        for end, values in (("max", busiest), ("min", idlest)):
            key = f"train/moe_load_{end}/{layer}"
            torch.testing.assert_close(torch.tensor(values), torch.tensor(metric_values(one, key)), rtol=1e-6,
                                       atol=1e-6, msg=key)
    # the balancing loss: a mean over the step's microbatches under stages, near the whole batch's
    balance, whole = metric_values(other, "train/moe_balance_loss"), metric_values(one, "train/moe_balance_loss")
    assert len(balance) == STEPS
    torch.testing.assert_close(torch.tensor(balance), torch.tensor(whole), rtol=0.05, atol=0.0)


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved_zero_bubble"])
def test_pipeline_stages_add_their_experts_losses_as_one_process_with_their_microbatches(schedule):
    """Only the last pipeline stage computes the loss: each stage's balancing and z-losses join its
    own backward with the microbatch loss's weight (also where torch splits the backward into its
    input and weight parts: zero bubble), and the tokens per expert are counted per pipeline
    microbatch (as Megatron counts them), so the numbers are one process's whose micro-batches are
    the pipeline's microbatches: 2 ranks cut each 8-sample micro-batch into a microbatch per stage
    (2 stages of a Block each, or 4, two a rank), against one process at 8 / stages samples a
    micro-batch; every stage's layers add losses."""
    stages = 2 if schedule == "1f1b" else 4
    extra = [*BASE, *MOE, f"model.n_layer={stages}", "model.moe.balance_coef=0.1", "model.moe.z_loss_coef=0.01"]
    staged = trained_run([*extra, "strategy=pipeline", "devices=2", f"strategy.schedule={schedule}",
                          f"strategy.stages_per_rank={stages // 2}"])
    # BASE: 8 samples a micro-batch, 2 micro-batches a step
    single = [*extra, "strategy=single_device", "devices=1", f"data.batch_size={8 // stages}",
              f"trainer.accumulate={2 * stages}"]
    one = trained_run(single)
    assert_close_metrics(staged, one, ("train/loss", "train/grad_norm", "train/moe_balance_loss", "train/moe_z_loss"),
                         STEPS)
    assert_close_weights(checkpoint_at(one, STEPS), checkpoint_at(staged, STEPS))
    if schedule == "1f1b":  # the losses trained the routers: without them the first Block's ends elsewhere
        plain = trained_run([*single, "model.moe.balance_coef=0", "model.moe.z_loss_coef=0"])
        router = "blocks.0.moe.router.weight"
        trained = load_model_state(checkpoint_at(one, STEPS))[router]
        assert (load_model_state(checkpoint_at(plain, STEPS))[router] - trained).abs().max() > 1e-4
