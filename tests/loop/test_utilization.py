"""train/mfu: the model's training FLOPs per item (counted from the model as built) times the
logged throughput, over the devices' peak (the table, or trainer.peak_tflops)."""
from __future__ import annotations

import csv

import pytest
import torch
from torch import nn

from framework.accelerator.peak_flops import arithmetic, peak_for
from framework.loop.utilization import Utilization
from framework.models.flops import matmul_weights, training_flops_per_item
from framework.models.gan import GAN
from framework.models.gpt import GPT
from framework.models.mlp import MLP
from tests.conftest import DIGITS, TINY_GPT, run_inprocess


def closed_form(layers: int, width: int, vocab: int, context: int) -> float:
    """6 x (a block's 12 d^2 matrix weights x layers + the tied head's V d) + 12 L d T."""
    return 6.0 * (12 * layers * width ** 2 + vocab * width) + 12.0 * layers * width * context


def test_the_gpt_count_is_the_closed_form_with_attention_over_the_context():
    model = GPT(vocab_size=256, block_size=64, n_layer=3, n_head=4, n_embd=48)
    assert training_flops_per_item(model, 64) == closed_form(3, 48, 256, 64)
    assert training_flops_per_item(model, 16) == closed_form(3, 48, 256, 16)  # shorter batches: less attention


def test_frozen_weights_cost_forward_and_the_input_gradient_only():
    model = GPT(vocab_size=256, block_size=32, n_layer=2, n_head=4, n_embd=32)
    for block in model.blocks:
        block.requires_grad_(False)  # a LoRA base: no weight gradients
    trainable, frozen = matmul_weights(model)
    assert (trainable, frozen) == (256 * 32, 2 * 12 * 32 * 32)
    assert training_flops_per_item(model, 32) == 6.0 * trainable + 4.0 * frozen + 12.0 * 2 * 32 * 32


def test_transformers_models_count_like_the_closed_form():
    transformers = pytest.importorskip("transformers")
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=48,
                                                                n_layer=3, n_head=4))  # Conv1D layers, tied head
    assert training_flops_per_item(gpt2, 64) == closed_form(3, 48, 256, 64)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=False))
    kv = 2 * 16  # two key/value heads of 16
    per_layer = 64 * 64 * 2 + 64 * kv * 2 + 3 * 64 * 96  # q, o; k, v; gate, up, down
    assert training_flops_per_item(llama, 32) == 6.0 * (2 * per_layer + 256 * 64) + 12.0 * 2 * 64 * 32


def test_a_classifier_counts_per_sample_and_a_convolution_is_not_priced():
    mlp = MLP(in_features=64, hidden=32, depth=2, num_classes=10)
    assert training_flops_per_item(mlp, None) == 6.0 * (64 * 32 + 32 * 32 + 32 * 10)
    assert training_flops_per_item(nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten()), None) is None


def test_the_peak_table_by_device_and_arithmetic(monkeypatch):
    assert peak_for("NVIDIA H100 80GB HBM3", "16-bit") == 989e12
    assert peak_for("NVIDIA H100 PCIe", "16-bit") == 756e12  # not the SXM part's
    assert peak_for("NVIDIA A100-SXM4-80GB", "tf32") == 156e12
    assert peak_for("NVIDIA L40", "16-bit") == 181e12 and peak_for("NVIDIA L4", "16-bit") == 121e12
    assert peak_for("Tesla V100-SXM2-16GB", "tf32") is None  # no TF32 on Volta
    assert peak_for("Some Future GPU", "16-bit") is None
    assert arithmetic(torch.bfloat16) == "16-bit"
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert arithmetic(torch.float32) == "tf32"
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    assert arithmetic(torch.float32) == "fp32"


def test_no_mfu_where_the_peak_or_the_count_is_unknown():
    cpu = torch.device("cpu")
    unknown = Utilization(GPT(n_layer=1, n_embd=32, n_head=2), cpu, torch.float32, 1, None, manual=False)
    assert unknown.of(1e6) is None and "trainer.peak_tflops" in unknown.why_not and not unknown.waiting
    gan = Utilization(GAN(), cpu, torch.float32, 1, 100.0, manual=True)
    assert gan.of(1e6) is None and "steps its optimizers itself" in gan.why_not


def test_a_gan_run_logs_no_mfu_and_trains(tmp_path):
    from tests.tasks.test_manual_optimization import GAN as GAN_RUN

    run_inprocess([*GAN_RUN, "trainer.max_steps=4", "trainer.log_every=2", "trainer.peak_tflops=0.5",
                   "trainer.val_at_start=false"], tmp_path)
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert "train/mfu" not in rows[0] and any(r.get("train/samples_per_s") for r in rows)


@pytest.mark.parametrize("task", ["language model", "classifier"])
def test_the_logged_mfu_is_throughput_times_flops_over_the_peak(tmp_path, task):
    args = ([*TINY_GPT, "trainer.max_steps=4"] if task == "language model" else
            [*DIGITS, "trainer.max_steps=10", "trainer.log_every=5"])
    run_inprocess([*args, "trainer.peak_tflops=0.5", "trainer.val_at_start=false", "callbacks=[]"], tmp_path)
    rows = [r for r in csv.DictReader(open(tmp_path / "metrics.csv")) if r.get("train/mfu")]
    assert len(rows) == 2
    if task == "language model":  # TINY_GPT: 1 layer of 32, bytes, batches of 32 positions
        flops, unit = closed_form(1, 32, 256, 32), "tokens"
    else:  # the digits MLP: 64 inputs, two hidden layers of 128 (conf/model/mlp.yaml), 10 classes
        flops, unit = 6.0 * (64 * 128 + 128 * 128 + 128 * 10), "samples"
    for row in rows:
        assert float(row["train/mfu"]) == pytest.approx(float(row[f"train/{unit}_per_s"]) * flops / 0.5e12, rel=1e-9)
