"""adapter=lora: peft's adapters injected into the model, everything else frozen; checkpoints hold
the trainable weights alone and resume exactly; the same losses under ddp and fsdp; what cannot be
adapted is refused by key."""
from __future__ import annotations

import csv
import importlib.util
import json

import pytest
import torch

from framework.adapter.lora import LoRA, count_parameters
from framework.errors import ConfigError
from framework.models.gpt import GPT
from framework.models.mlp import MLP
from tests.conftest import TINY_GPT, assert_resume_is_exact, checkpoints, load_model_state, run_inprocess

pytest.importorskip("peft")
ADAPTED = [*TINY_GPT, "adapter=lora", "adapter.r=4", "model.dropout=0.0", "trainer.val_every=2"]


def test_the_gpt_gets_adapters_on_its_projections_and_nothing_else_trains():
    torch.manual_seed(0)
    model = LoRA(r=4).apply(GPT(n_layer=2, n_embd=32, n_head=2, block_size=16))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"blocks.{b}.{m}.lora_{ab}.default.weight" for b in (0, 1)
                         for m in ("attn.qkv", "attn.proj", "mlp.0", "mlp.2") for ab in "AB"}
    # rank 4 on qkv (32 -> 96), proj (32 -> 32), mlp.0 (32 -> 128), mlp.2 (128 -> 32)
    per_block = 4 * (32 + 96) + 4 * (32 + 32) + 4 * (32 + 128) + 4 * (128 + 32)
    assert count_parameters(model)[0] == 2 * per_block
    x = torch.randint(0, 256, (2, 8))
    plain = GPT(n_layer=2, n_embd=32, n_head=2, block_size=16)
    plain.load_state_dict({k.replace(".base_layer.", "."): v for k, v in model.state_dict().items() if "lora_" not in k})
    torch.testing.assert_close(model(x), plain(x))  # B starts at zero: the adapted model computes the same


@pytest.mark.parametrize("adapter,model,message", [
    (LoRA(target_modules=["qkvv"]), lambda: GPT(n_layer=1, n_embd=32, n_head=2), "'qkvv' match no linear layer of the "
     "model. Did you mean qkv? Its linear layers: blocks.0.attn.qkv"),
    (LoRA(r=64), lambda: GPT(n_layer=1, n_embd=32, n_head=2), "adapter.r=64: larger than blocks.0.attn.qkv's smaller "
     "dimension (32)"),
    (LoRA(), lambda: torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3)), "has no linear layer to adapt"),
    (LoRA(), lambda: MLP(), "adapter.target_modules: no default for a MLP model; name its layers"),
])
def test_what_cannot_be_adapted_is_refused(adapter, model, message):
    with pytest.raises(ConfigError) as err:
        adapter.apply(model())
    assert message in str(err.value)


def test_frozen_weights_stay_and_checkpoints_hold_the_adapters_alone(tmp_path):
    out = tmp_path / "run"
    run_inprocess([*ADAPTED, "trainer.max_steps=4"], out)
    saved = load_model_state(checkpoints(out)[-1])
    assert saved and all("lora_" in name for name in saved)
    assert any(name.endswith("lora_B.default.weight") and value.abs().sum() > 0 for name, value in saved.items())
    meta = json.loads((checkpoints(out)[-1] / "meta.json").read_text())
    assert meta["adapter_weights"] == len(saved)


def test_an_adapter_run_resumes_exactly(tmp_path):
    assert_resume_is_exact(ADAPTED, tmp_path, steps=4)


def test_qlora_quantizes_the_frozen_layers_and_keeps_the_adapters_in_float():
    """precision=bnb_nf4 + adapter=lora: the model is built with its linear layers quantized as they
    are made, then the adapters wrap those quantized layers; they stay float32 and train, and with
    B at zero the adapted model computes what the quantized one does."""
    pytest.importorskip("bitsandbytes")
    from framework.construction.quantized_build import build_quantized
    from framework.precision.bnb_nf4 import BnbNF4Precision

    precision = BnbNF4Precision(compute_dtype="fp32")
    torch.manual_seed(0)
    quantized = build_quantized(lambda: GPT(n_layer=1, n_embd=32, n_head=2, block_size=16), precision)
    torch.manual_seed(0)
    adapted = LoRA(r=4).apply(build_quantized(lambda: GPT(n_layer=1, n_embd=32, n_head=2, block_size=16), precision))
    qkv = adapted.blocks[0].attn.qkv
    assert "4bit" in type(qkv.base_layer).__name__ and type(qkv.lora_A.default) is torch.nn.Linear
    assert qkv.lora_A.default.weight.dtype == torch.float32 and qkv.lora_A.default.weight.requires_grad
    assert precision.plan_layers(adapted)[0] == []  # the base layers are quantized, the adapters' stay float
    # a model that could not be built quantized is quantized after: its base layers, never the adapters'
    assert precision.plan_layers(LoRA(r=4).apply(GPT(n_layer=1, n_embd=32, n_head=2, block_size=16)))[0] == [
        f"blocks.0.{m}.base_layer" for m in ("attn.qkv", "attn.proj", "mlp.0", "mlp.2")]
    x = torch.randint(0, 256, (2, 8))
    with torch.no_grad():
        torch.testing.assert_close(adapted(x), quantized(x))


def test_a_qlora_run_trains_the_adapters_alone_and_resumes_exactly(tmp_path):
    pytest.importorskip("bitsandbytes")
    straight, _ = assert_resume_is_exact([*ADAPTED, "precision=bnb_nf4", "precision.compute_dtype=fp32"], tmp_path,
                                         steps=4)
    saved = load_model_state(straight)
    assert saved and all("lora_" in name for name in saved)


@pytest.mark.slow
def test_every_strategy_trains_the_adapters_as_one_process_does(tmp_path):
    """From one base model's weights (a plain GPT's file: its names mapped onto the adapted layers),
    the frozen base sharded (fsdp, ZeRO-3: the adapters made whole after zero.Init, partitioned by
    deepspeed.initialize), replicated or quantized (QLoRA), the adapters start the same and train the
    same."""
    torch.manual_seed(0)
    base = GPT(n_layer=1, n_embd=32, n_head=2, block_size=32)
    torch.save(base.state_dict(), tmp_path / "base.pt")
    losses = {}
    two = ["devices=2", "data.batch_size=4", f"ckpt_path={tmp_path / 'base.pt'}"]
    qlora = ["precision=bnb_nf4", "precision.compute_dtype=fp32"]
    for name, overrides in {"one": [], "ddp": ["strategy=ddp", *two], "fsdp": ["strategy=fsdp", *two],
                            "zero2": ["strategy=deepspeed_stage_2", *two], "zero3": ["strategy=deepspeed_stage_3", *two],
                            "qlora": [*qlora, "data.batch_size=8", f"ckpt_path={tmp_path / 'base.pt'}"],
                            "qlora_ddp": [*qlora, "strategy=ddp", *two]}.items():
        batch = [] if overrides else ["data.batch_size=8", f"ckpt_path={tmp_path / 'base.pt'}"]
        run_inprocess([*ADAPTED, "trainer.max_steps=2", "callbacks.checkpoint.every_n_steps=1",
                       "callbacks.checkpoint.keep_last_k=2", *batch, *overrides], tmp_path / name)
        losses[name] = [float(r["val/loss"]) for r in csv.DictReader(open(tmp_path / name / "metrics.csv"))
                        if r.get("val/loss")]
    for name in ("ddp", "fsdp", "zero2", "zero3"):  # before training, and after 2 steps
        assert len(losses[name]) == 2 and losses[name] == pytest.approx(losses["one"], abs=1e-5), name
    assert losses["qlora_ddp"] == pytest.approx(losses["qlora"], abs=1e-5)  # QLoRA: the 4-bit base replicated
    assert losses["qlora"] != pytest.approx(losses["one"], abs=1e-5)  # it is the quantized base that trains
    zero3 = load_model_state(checkpoints(tmp_path / "zero3")[-1])
    assert zero3 and all("lora_" in name for name in zero3)  # gathered whole from the partitions: adapters alone
    # the same adapters from the start: after step 1 an A has had no gradient yet (B is zero), so it is
    # its initial value (times AdamW's decay), drawn per layer from the run's seed whatever the build
    first = {name: load_model_state(checkpoints(tmp_path / name)[0]) for name in losses}
    for name, state in first.items():
        for key, value in first["one"].items():
            if ".lora_A." in key:
                torch.testing.assert_close(state[key], value, rtol=0, atol=1e-7, msg=f"{name}: {key}")


def test_test_and_generate_rebuild_the_adapted_model(tmp_path):
    """framework test, and framework generate's loader, rebuild the frozen weights (here the seeded
    initialisation; a pretrained model's own weights otherwise) and load the adapters: both score
    what the live model scored when fit ended."""
    from torch.nn import functional as F

    from framework.cli import main as framework_main
    from framework.data.stdlib_text import StdlibText
    from framework.generation.load import load_model

    out = tmp_path / "run"
    run_inprocess([*ADAPTED, "trainer.max_steps=4", "trainer.test_at_end=true", "trainer.test_batches=1"], out)
    at_end = json.loads((out / "test_metrics.json").read_text())["metrics"]["test/loss"]
    assert framework_main(["test", str(out), "trainer.test_batches=1"]) == 0
    assert json.loads((out / "test_metrics.json").read_text())["metrics"]["test/loss"] == pytest.approx(at_end, abs=1e-6)
    loaded = load_model(out, "framework generate")
    test = StdlibText(block_size=32, max_bytes=300000).test_dataset()
    x = torch.stack([test[i][0] for i in range(32)])
    y = torch.stack([test[i][1] for i in range(32)])
    with torch.no_grad():
        loss = F.cross_entropy(loaded.model(x).reshape(-1, 256), y.reshape(-1)).item()
    assert loss == pytest.approx(at_end, abs=1e-5)


def test_exports_merge_the_adapters_or_write_a_directory_peft_loads(tmp_path):
    """--to safetensors: a plain model computing what the adapted one does; --to peft: a directory
    that peft.PeftModel.from_pretrained loads onto the base model, the same outputs again."""
    from peft import PeftModel
    from safetensors.torch import load_file

    from framework.cli import main as framework_main
    from framework.generation.load import load_model

    out = tmp_path / "run"
    run_inprocess([*ADAPTED, "trainer.max_steps=3"], out)
    checkpoint = checkpoints(out)[-1]
    adapted = load_model(out, "test").model
    x = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        expected = adapted(x)
    assert framework_main(["convert", str(checkpoint), str(tmp_path / "merged.safetensors"), "--to", "safetensors"]) == 0
    plain = GPT(n_layer=1, n_embd=32, n_head=2, block_size=32)
    weights = load_file(str(tmp_path / "merged.safetensors"))
    plain.load_state_dict({**weights, "head.weight": weights["tok_emb.weight"]})
    with torch.no_grad():
        torch.testing.assert_close(plain.eval()(x), expected, atol=1e-5, rtol=1e-5)
    assert framework_main(["convert", str(checkpoint), str(tmp_path / "peft"), "--to", "peft"]) == 0
    assert (tmp_path / "peft" / "adapter_config.json").is_file()
    torch.manual_seed(1234)  # the run's seed: its base model's initialisation
    base = GPT(n_layer=1, n_embd=32, n_head=2, block_size=32)
    loaded = PeftModel.from_pretrained(base, str(tmp_path / "peft")).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), expected, atol=1e-5, rtol=1e-5)
    assert framework_main(["convert", str(checkpoint), str(tmp_path / "peft"), "--to", "peft"]) == 2  # not empty


def test_a_hugging_face_models_adapters_merge_into_a_from_pretrained_directory(tmp_path):
    transformers = pytest.importorskip("transformers")
    from framework.cli import main as framework_main
    from framework.generation.load import load_model

    out = tmp_path / "run"
    tiny = [o for o in TINY_GPT if not o.startswith("model.")]
    run_inprocess([*tiny, "data.block_size=32", "model=hf_causal_lm", "model.config.n_layer=1", "model.config.n_embd=32",
                   "model.config.n_head=2", "model.config.n_positions=32", "adapter=lora", "adapter.r=4",
                   "trainer.max_steps=3", "trainer.val_every=3"], out)
    assert all("lora_" in name for name in load_model_state(checkpoints(out)[-1]))  # GPT-2's Conv1D layers adapted
    adapted = load_model(out, "test").model
    x = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        expected = adapted(x).logits
    assert framework_main(["convert", str(checkpoints(out)[-1]), str(tmp_path / "hf"), "--to", "hf"]) == 0
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(x).logits, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_adapters_on_a_pretrained_model_loaded_shard_wise_start_from_its_outputs(tmp_path):
    """A pretrained directory's weights (saved before any adapter) load onto the adapted layers,
    under fsdp and ZeRO-3 shard by shard (the model built on the meta device, or partitioned as it
    is made): with B at zero the first validation is the pretrained model's own. The adapters start
    from the same values under every strategy and under QLoRA (each A drawn from the run's seed and
    its layer's name: the builds draw different amounts from the global generator before, measured
    up to 0.246 apart), and fsdp@2 and ZeRO-3@2 train them as one process does."""
    import csv

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=1, n_head=2, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)  # dropout off: ranks draw their own masks
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "pretrained")
    tiny = [o for o in TINY_GPT if not o.startswith("model.")]
    common = [*tiny, "data.block_size=32", "model=hf_causal_lm", "model.config=null",
              f"model.pretrained={tmp_path / 'pretrained'}", "trainer.max_steps=2", "trainer.val_every=2",
              "callbacks.checkpoint.every_n_steps=1", "callbacks.checkpoint.keep_last_k=2"]
    two = ["devices=2", "data.batch_size=4"]
    runs = {"plain": ["trainer.max_steps=1"], "one": ["adapter=lora", "adapter.r=4"],
            "fsdp": ["adapter=lora", "adapter.r=4", "strategy=fsdp", *two],
            "zero3": ["adapter=lora", "adapter.r=4", "strategy=deepspeed_stage_3", *two]}
    if importlib.util.find_spec("bitsandbytes"):
        runs["qlora"] = ["adapter=lora", "adapter.r=4", "precision=bnb_nf4", "precision.compute_dtype=fp32"]
    scores = {}
    for name, overrides in runs.items():
        run_inprocess([*common, *overrides], tmp_path / "outputs" / name)
        scores[name] = [float(r["val/loss"]) for r in csv.DictReader(open(tmp_path / "outputs" / name / "metrics.csv"))
                        if r.get("val/loss")]
    assert scores["one"][0] == pytest.approx(scores["plain"][0], abs=1e-6)  # the pretrained model's own outputs
    assert scores["fsdp"] == pytest.approx(scores["one"], abs=1e-5)
    assert scores["zero3"] == pytest.approx(scores["one"], abs=1e-5)
    # after step 1 an A has had no gradient yet (B is zero): its initial value (times AdamW's decay)
    first = {name: load_model_state(checkpoints(tmp_path / "outputs" / name)[0]) for name in runs if name != "plain"}
    adapters = [key for key in first["one"] if ".lora_A." in key]
    assert adapters
    for name, state in first.items():
        for key in adapters:
            torch.testing.assert_close(state[key], first["one"][key], rtol=0, atol=1e-7, msg=f"{name}: {key}")


def test_qlora_keeps_its_adapters_in_float32_and_generate_rebuilds_its_4bit_base(tmp_path):
    """Under precision=bnb_nf4 (computing in bfloat16) peft makes the adapters in the 4-bit layer's
    compute dtype; they stay float32, and so do their Adam moments. framework generate (and
    predict) rebuild the run's model with its 4-bit layers, as it trained, and say so; convert says
    its export holds the float weights instead."""
    pytest.importorskip("bitsandbytes")
    from framework.generation.load import load_model, rebuild
    from tests.conftest import load_optimizer_state

    out = tmp_path / "run"
    run_inprocess([*ADAPTED, "precision=bnb_nf4", "trainer.max_steps=2"], out)
    checkpoint = checkpoints(out)[-1]
    assert {v.dtype for v in load_model_state(checkpoint).values()} == {torch.float32}
    moments = [v for state in load_optimizer_state(checkpoint)["state"].values() for k, v in state.items()
               if k.startswith("exp_avg")]
    assert moments and {m.dtype for m in moments} == {torch.float32}
    loaded = load_model(out, "framework generate")
    assert "its bnb_nf4 layers as it trained" in loaded.source
    assert any("4bit" in type(m).__name__ for m in loaded.model.modules())
    float_base = rebuild(checkpoint, loaded.config, quantized=False).eval()
    x = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        assert not torch.allclose(loaded.model(x).float(), float_base(x), atol=1e-4)  # not the float base
