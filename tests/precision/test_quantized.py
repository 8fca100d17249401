"""precision=bnb_int8 / bnb_nf4 / bnb_nf4_dq / bnb_fp4: which layers are quantized and frozen,
what trains, how close the quantized model computes to float32, checkpoints (bit-exact in the
quantized form, float weights quantized as they load, a quantized run's weights dequantized for an
unquantized model), the checks before launch, and real runs (single_device, ddp at 2 processes)."""
from __future__ import annotations

import csv

import pytest
import torch

from framework.checkpoint.weights import fit_saved_state
from framework.config.compatibility import judge
from framework.models.gpt import GPT
from framework.precision.bnb_fp4 import BnbFP4Precision
from framework.precision.bnb_int8 import BnbInt8Precision
from framework.precision.bnb_nf4 import BnbNF4Precision
from framework.precision.bnb_nf4_dq import BnbNF4DoubleQuantPrecision
from framework.preflight import compatibility_plan, prepare
from tests.conftest import TINY_GPT, checkpoints, compose_cfg, load_model_state, run_inprocess, run_train
from tests.helpers.in_process import run_command

pytest.importorskip("bitsandbytes", reason="bitsandbytes is in the dev extra; `pip install 'framework[quant]'`")

ALL = [BnbInt8Precision, BnbNF4Precision, BnbNF4DoubleQuantPrecision, BnbFP4Precision]
# The largest error of the output logits against the float32 model's, for this tiny GPT
TOLERANCE = {"bnb_int8": 0.05, "bnb_nf4": 0.3, "bnb_nf4_dq": 0.3, "bnb_fp4": 0.4}
LINEARS = {f"blocks.{i}.{name}" for i in range(2) for name in ("attn.qkv", "attn.proj", "mlp.0", "mlp.2")}


def gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(n_layer=2, n_embd=64, n_head=2, block_size=16)


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(seed))


def quantized(cls, seed: int = 0, **options):
    precision = cls(**options)
    precision.setup("cpu")
    return precision.convert_module(gpt(seed)), precision


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.name)
def test_linear_layers_frozen_and_quantized_the_rest_trains_in_float32(cls):
    reference = gpt()
    model, precision = quantized(cls)
    modules = dict(model.named_modules())
    assert {n for n, m in modules.items() if hasattr(m, "dequantized_weight")} == LINEARS
    assert type(modules["head"]) is torch.nn.Linear and model.head.weight is model.tok_emb.weight  # tied: kept
    for name in LINEARS:
        weight = modules[name].weight
        assert not weight.requires_grad
        assert weight.dtype == (torch.int8 if cls is BnbInt8Precision else torch.uint8)
        assert modules[name].bias.dtype == torch.float32 and modules[name].bias.requires_grad
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in reference.named_parameters()} - {f"{n}.weight" for n in LINEARS}
    assert f"{cls.name}: 8 linear layers quantized" in precision.conversion_note
    assert "kept unquantized: head (weight tied to another module)" in precision.conversion_note
    x = tokens()
    error = (model(x) - reference(x)).abs().max().item()
    assert 0 < error < TOLERANCE[cls.name]

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    frozen = {n: modules[n].weight.detach().clone() for n in LINEARS}

    def loss():
        logits = model(x[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 256), x[:, 1:].reshape(-1))

    first = loss().item()
    for _ in range(5):
        loss().backward()
        optimizer.step()
        optimizer.zero_grad()
    assert loss().item() < first - 0.05
    assert all(torch.equal(modules[n].weight, frozen[n]) for n in LINEARS)  # the frozen weights never move
    assert all(modules[n].bias.dtype == torch.float32 for n in LINEARS)  # not cast under the optimizer


def test_int8_values_and_scales_move_with_the_module():
    """Placing a quantized model on its device moves what bitsandbytes' int8 matmul reads beside
    the weight (CB, SCB): left where the layer was quantized, CUDA's matmul failed. Here Module.to's
    step on each tensor is a copy on the same device (bitsandbytes' parameters cannot go to meta):
    the values the matmul reads are the moved weight's, the scales stay float32 under a cast."""
    model, _ = quantized(BnbInt8Precision)
    layer = model.blocks[0].mlp[0]
    old = layer.weight.data_ptr()
    layer._apply(lambda t: t.clone())
    assert layer.weight.data_ptr() != old and layer.weight.CB.data_ptr() == layer.weight.data_ptr()
    before = model(tokens())  # the forward hands CB/SCB over to the layer's state
    old = layer.weight.data_ptr()
    layer._apply(lambda t: t.clone())
    assert layer.weight.data_ptr() != old and layer.state.CB.data_ptr() == layer.weight.data_ptr()
    torch.testing.assert_close(model(tokens()), before, rtol=0, atol=0)
    model.to(torch.bfloat16)
    assert layer.SCB.dtype == torch.float32 and layer.weight.dtype == torch.int8


@pytest.mark.parametrize("cls", [BnbInt8Precision, BnbNF4DoubleQuantPrecision], ids=lambda c: c.name)
def test_quantized_from_birth_is_bit_identical_to_quantizing_an_ordinary_build(cls):
    """The strategy builds on the meta device and quantizes each layer as it is made (the float32
    model never exists whole): the same weights as an ordinary build quantized afterwards, and the
    RNG in the state an unquantized build leaves it in."""
    from framework.strategy.single_device import SingleDeviceStrategy

    torch.manual_seed(0)
    expected, _ = quantized(cls, seed=0)
    torch.manual_seed(0)
    gpt(seed=0)
    after_plain_build = torch.rand(4)
    precision = cls()
    strategy = SingleDeviceStrategy(precision=precision)
    torch.manual_seed(0)
    built = strategy.build_model(lambda: GPT(n_layer=2, n_embd=64, n_head=2, block_size=16))
    assert torch.equal(torch.rand(4), after_plain_build)
    assert {n for n, m in built.named_modules() if hasattr(m, "dequantized_weight")} == LINEARS  # before setup
    model, _ = strategy.setup(built, lambda params: torch.optim.SGD(params, lr=0.1))
    assert model.head.weight is model.tok_emb.weight
    assert f"{cls.name}: 8 linear layers quantized" in precision.conversion_note
    for key, value in expected.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key


class _RandomInit(torch.nn.Module):
    """A constructor the meta device cannot record (torch.randn): built whole, then quantized."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 64)
        self.scale = torch.nn.Parameter(torch.randn(64))


def test_a_model_that_cannot_be_built_on_meta_is_built_whole_then_quantized():
    from framework.strategy.single_device import SingleDeviceStrategy

    torch.manual_seed(0)
    expected = BnbNF4Precision().convert_module(_RandomInit())
    strategy = SingleDeviceStrategy(precision=BnbNF4Precision())
    torch.manual_seed(0)
    model, _ = strategy.setup(strategy.build_model(_RandomInit), lambda params: torch.optim.SGD(params, lr=0.1))
    assert hasattr(model.proj, "dequantized_weight")
    for key, value in expected.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.name)
def test_checkpoint_holds_the_quantized_form_and_loads_it_bit_exact(cls):
    model, _ = quantized(cls, seed=0)
    x = tokens()
    expected = model(x)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    packed = sum(v.numel() * v.element_size() for k, v in state.items()
                 if any(k.startswith(n + ".") for n in LINEARS) and not k.endswith("bias"))
    float_bytes = 4 * sum(gpt().get_submodule(n).weight.numel() for n in LINEARS)
    assert packed / float_bytes < (0.27 if cls is BnbInt8Precision else 0.16)

    other, _ = quantized(cls, seed=7)
    assert not torch.equal(other(x), expected)
    optimizer = torch.optim.SGD(other.parameters(), lr=0.1)
    held = [p for group in optimizer.param_groups for p in group["params"]]
    assert not other.load_state_dict(state).missing_keys
    assert torch.equal(other(x), expected)
    assert all(a is b for a, b in zip(held, other.parameters()))  # loaded in place: the optimizer's own objects
    for key, value in other.state_dict().items():
        assert torch.equal(value, state[key]), key


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.name)
def test_float_weights_are_quantized_as_they_load(cls):
    """Pretrained weights, or a checkpoint of an unquantized run, into a quantized model: the same
    as quantizing a model built with those weights."""
    model, _ = quantized(cls, seed=0)
    other, _ = quantized(cls, seed=3)
    other.load_state_dict(gpt(seed=0).state_dict())
    x = tokens()
    assert torch.equal(other(x), model(x))


@pytest.mark.parametrize("cls", [BnbInt8Precision, BnbNF4Precision, BnbFP4Precision], ids=lambda c: c.name)
def test_a_quantized_checkpoint_loads_dequantized_into_an_unquantized_model(cls):
    model, _ = quantized(cls)
    state = model.state_dict()
    plain = gpt(seed=5)
    fitted = fit_saved_state(plain, state)
    plain.load_state_dict(fitted)
    for name in LINEARS:
        assert torch.equal(plain.get_submodule(name).weight, model.get_submodule(name).dequantized_weight())
    # and back: quantizing the dequantized weights gives the same weights (the same stored bytes,
    # except that fp4 has two zeros)
    again, _ = quantized(cls, seed=9)
    again.load_state_dict(fitted)
    for name in LINEARS:
        assert torch.equal(again.get_submodule(name).dequantized_weight(),
                           model.get_submodule(name).dequantized_weight())
    if cls is not BnbFP4Precision:
        for key, value in again.state_dict().items():
            assert torch.equal(value, state[key]), key
    # a quantized model is left to load the stored form itself
    assert fit_saved_state(model, state) is state


def test_skip_modules_by_last_name_and_glob():
    model, precision = quantized(BnbNF4Precision, skip_modules=["proj", "blocks.1.mlp.*"])
    kept = {n for n, m in model.named_modules() if type(m) is torch.nn.Linear}
    assert kept == {"head", "blocks.0.attn.proj", "blocks.1.attn.proj", "blocks.1.mlp.0", "blocks.1.mlp.2"}
    assert all(p.requires_grad for n, p in model.named_parameters() if n.startswith("blocks.1.mlp"))
    frozen = sum(gpt().get_submodule(n).weight.numel() for n in LINEARS if n not in kept)
    assert precision.frozen_weights(gpt()) == (frozen, int(frozen * 4.5 / 8))


def test_hugging_face_conv1d_is_quantized_transposed():
    pytest.importorskip("transformers")
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    model = torch.nn.Sequential(Conv1D(48, 32), torch.nn.GELU(), Conv1D(32, 48))  # Conv1D(out, in): weight (in, out)
    source = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(3, 32)
    expected = model(x)
    precision = BnbInt8Precision()
    converted = precision.convert_module(model)
    assert all(hasattr(converted[i], "dequantized_weight") for i in (0, 2))
    assert (converted(x) - expected).abs().max() < 0.05
    other = BnbInt8Precision().convert_module(
        torch.nn.Sequential(Conv1D(48, 32), torch.nn.GELU(), Conv1D(32, 48)))
    other.load_state_dict(source)  # Hugging Face's (in, out) weights load transposed
    assert torch.equal(other(x), converted(x))
    # and a checkpoint of it loads into the unquantized Conv1D model, (in, out) again
    state = converted.state_dict()
    assert state["0.weight_transposed"].item() and "1.weight_transposed" not in state  # (GELU)
    plain = torch.nn.Sequential(Conv1D(48, 32), torch.nn.GELU(), Conv1D(32, 48))
    plain.load_state_dict(fit_saved_state(plain, state))
    assert torch.equal(plain[0].weight, converted[0].dequantized_weight().t())


def test_a_quantized_hugging_face_model_exports_for_from_pretrained(tmp_path):
    """`framework convert --to hf` of a quantized run: the dequantized weights, GPT-2's Conv1D ones
    turned back to (in, out), load with from_pretrained and compute what the quantized model did."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from framework.models.hf_causal_lm import causal_lm, save_for_hub
    from framework.precision.quantized_layers import dequantize_weights, quantized_weight_keys

    config = {"model_type": "gpt2", "vocab_size": 256, "n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": 2}
    torch.manual_seed(1)
    model = BnbNF4Precision(compute_dtype="fp32").convert_module(causal_lm(config=config)).eval()
    state = model.state_dict()
    save_for_hub(dequantize_weights(state, quantized_weight_keys(state)),
                 {"_target_": "framework.models.hf_causal_lm.causal_lm", "config": config}, tmp_path / "out")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    attn = model.transformer.h[0].attn.c_attn
    assert torch.equal(loaded.transformer.h[0].attn.c_attn.weight, attn.dequantized_weight().t())
    x = tokens()
    assert torch.allclose(loaded(x).logits, model(x).logits, atol=1e-4)


def test_problems_before_launch():
    cfg = compose_cfg([*TINY_GPT, "precision=bnb_nf4", "precision.skip_modules=[hed]"])
    problems = prepare(cfg, strict=False).problems
    assert problems == [problems[0]] and problems[0].startswith(
        "precision.skip_modules: 'hed' names no linear layer of the model (it has: blocks.0.attn.qkv")
    cfg = compose_cfg([*TINY_GPT, "precision=bnb_nf4", "precision.skip_modules=[qkv,proj,mlp.0,mlp.2]"])
    assert prepare(cfg, strict=False).problems == [
        "precision=bnb_nf4: the model has no torch.nn.Linear layer to quantize (all are skipped or tied, or it has "
        "none); use precision=32 or bf16."]
    with pytest.raises(Exception, match="compute_dtype='fp8': use one of bf16, fp16, fp32"):
        prepare(compose_cfg([*TINY_GPT, "precision=bnb_nf4", "precision.compute_dtype=fp8"]))


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed_stage_2", "deepspeed_stage_3", "ddp_sharded"])
def test_refused_with_sharding_strategies(strategy):
    cfg = compose_cfg([*TINY_GPT, "precision=bnb_int8", f"strategy={strategy}", "devices=2"])
    problems = prepare(cfg, strict=False).problems
    assert any(p.startswith(f"precision=bnb_int8 with strategy={strategy}: the quantized layers' frozen weights")
               and "use strategy=ddp" in p for p in problems), problems


def test_fp16_compute_warned_where_the_device_has_no_fp16():
    prepared = prepare(compose_cfg([*TINY_GPT, "precision=bnb_nf4", "precision.compute_dtype=fp16"]), strict=False)
    fp16 = [w for w in prepared.warnings if "compute_dtype=fp16" in w]
    if prepared.plugins.accelerator.fast_fp16():
        assert fp16 == []
    else:
        faster = "bf16" if prepared.plugins.accelerator.fast_bf16() else "fp32"
        assert fp16 == ["precision=bnb_nf4 with precision.compute_dtype=fp16 on accelerator=cpu: this device has no "
                        "fp16 hardware, so the quantized layers will compute many times slower than with "
                        f"compute_dtype={faster}."]


def test_bf16_compute_warned_where_the_device_has_no_bf16():
    """The quantized precisions compute in bf16 by default: emulated, many times slower, on a CPU
    without bf16 hardware (the table's own predicate decides, on every kind of machine)."""
    prepared = prepare(compose_cfg([*TINY_GPT, "precision=bnb_nf4"]), strict=False)
    bf16 = [w for w in prepared.warnings if "compute_dtype=bf16" in w]
    if prepared.plugins.accelerator.fast_bf16():
        assert bf16 == []
    else:
        assert bf16 == ["precision=bnb_nf4 with precision.compute_dtype=bf16 on accelerator=cpu: this device has no "
                        "bf16 hardware, so the quantized layers will compute many times slower than with "
                        "precision.compute_dtype=fp32."]


def test_refused_without_bitsandbytes(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    prepared = prepare(compose_cfg([*TINY_GPT, "precision=bnb_nf4"]), strict=False)
    refusals, _ = judge(compatibility_plan(prepared.plugins, prepared.resolved, 1))
    assert refusals == ["precision=bnb_nf4 needs the bitsandbytes package, which is not installed; "
                        "pip install 'framework[quant]' (or choose another precision)."]


def _val_losses(run) -> list[float]:
    return [float(r["val/loss"]) for r in csv.DictReader(open(run / "metrics.csv")) if r.get("val/loss")]


@pytest.mark.slow
@pytest.mark.matrix(strategy="single_device", precision="bnb_nf4_dq")
def test_single_device_trains_resumes_bit_exact_and_moves_to_float32(tmp_path):
    from tests.conftest import assert_resume_is_exact

    base = [*TINY_GPT, "precision=bnb_nf4_dq", "trainer.val_every=2", "callbacks.checkpoint.every_n_steps=2"]
    straight, _ = assert_resume_is_exact(base, tmp_path, steps=4)
    saved = load_model_state(straight)
    assert any(k.endswith("weight.quant_state.bitsandbytes__nf4") for k in saved)
    # the same run's checkpoint resumed with precision=32: weights dequantized, every layer trains
    run_inprocess([*TINY_GPT, "trainer.max_steps=6", f"ckpt_path={straight}"], tmp_path / "float")
    plain = load_model_state(checkpoints(tmp_path / "float")[-1])
    assert not any(".quant_state." in k for k in plain) and plain["blocks.0.attn.qkv.weight"].dtype == torch.float32


@pytest.mark.slow
@pytest.mark.matrix(strategy="ddp", precision="bnb_int8")
def test_ddp_two_processes_keep_the_single_device_weights_and_resume_exact_through_dcp(tmp_path):
    """ddp keeps the small quantized model on each rank: its frozen weights are the single-device
    run's bit for bit; a ddp run saved with checkpoint_io=dcp and resumed equals a straight one."""
    args = ["trainer.val_every=2", "callbacks.checkpoint.every_n_steps=2", *TINY_GPT, "precision=bnb_int8"]
    ddp = [*args, "strategy=ddp", "devices=2", "data.batch_size=4"]
    # the runs whose printed lines are read: fresh interpreters; the others through the command's
    # own entry in this process
    runs = {"single": run_command(["train", *args, "trainer.max_steps=2", "name=single"], tmp_path),
            "straight": run_train([*ddp, "trainer.max_steps=4", "name=straight"], tmp_path),
            "half": run_command(["train", *ddp, "trainer.max_steps=2", "name=resumed", "checkpoint_io=dcp"], tmp_path),
            "resumed": run_train([*ddp, "trainer.max_steps=4", "name=resumed", "checkpoint_io=dcp", "resume=auto"],
                                 tmp_path)}
    for name, result in runs.items():
        assert result.returncode == 0, f"{name}: {result.stderr}"
    assert "precision=bnb_int8: 4 linear layers quantized to int8" in runs["straight"].stdout
    assert "resumed from" in runs["resumed"].stdout
    out = tmp_path / "outputs"
    single = load_model_state(checkpoints(out / "single")[-1])
    straight = load_model_state(checkpoints(out / "straight")[-1])
    resumed = load_model_state(checkpoints(out / "resumed")[-1])
    for key in ("blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.SCB"):
        assert torch.equal(single[key], straight[key])
    assert set(resumed) == set(straight)
    for key in straight:
        assert torch.equal(resumed[key], straight[key]), key
    losses = _val_losses(out / "straight")
    assert len(losses) == 3 and losses[-1] < losses[0]
