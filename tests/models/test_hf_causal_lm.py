"""Hugging Face causal LMs (framework/models/hf_causal_lm.py): random init the same in every build,
pretrained directories loaded whole or into shards, never a download, export to from_pretrained."""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from framework.checkpoint.weights import initial_weights
from framework.construction.meta_build import meta_device
from framework.construction.meta_init import build_on_meta, replay
from framework.errors import CheckpointError, ConfigError
from framework.models.hf_causal_lm import causal_lm, save_for_hub

pytest.importorskip("transformers")

GPT2 = {"model_type": "gpt2", "vocab_size": 256, "n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": 2}


def test_a_meta_build_replays_to_the_weights_of_an_ordinary_build():
    """transformers skips its initialisation on the meta device; the framework has it recorded, so
    fsdp's shards hold exactly what a single-device run with the same seed starts from."""
    torch.manual_seed(3)
    ordinary = causal_lm(config=GPT2).state_dict()
    after_ordinary = torch.rand(1)
    torch.manual_seed(3)
    model, log = build_on_meta(lambda: causal_lm(config=GPT2))
    assert log.problem is None and all(p.is_meta for p in model.parameters())
    replayed = {}
    replay(log, replayed.__setitem__)
    assert torch.equal(torch.rand(1), after_ordinary)  # the same random numbers were drawn
    for name, value in replayed.items():
        assert torch.equal(value, ordinary[name]), name
    assert set(ordinary) - set(replayed) == {"lm_head.weight"}  # tied to the embedding
    std = ordinary["transformer.h.0.attn.c_proj.weight"].std().item()
    assert abs(std - 0.02 / 2) < 0.002  # GPT-2's scaled residual init ran (0.02 / sqrt(2 * n_layer))


def test_pretrained_loads_whole_and_in_a_sharded_build_names_its_files(tmp_path):
    torch.manual_seed(0)
    saved = causal_lm(config=GPT2)
    saved.save_pretrained(tmp_path / "pre")
    loaded = causal_lm(pretrained=str(tmp_path / "pre"))
    for name, value in saved.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    with meta_device():  # the pre-launch check and fsdp: structure only, weights named
        meta = causal_lm(pretrained=str(tmp_path / "pre"))
    assert all(p.is_meta for p in meta.parameters())
    assert [p.rsplit("/", 1)[-1] for p in meta.pretrained_weights] == ["model.safetensors"]
    state = initial_weights(meta, meta.pretrained_weights)
    assert torch.equal(state["lm_head.weight"], saved.transformer.wte.weight)  # stored once, tied
    assert torch.equal(state["transformer.h.1.mlp.c_fc.weight"], saved.transformer.h[1].mlp.c_fc.weight)


def test_initial_weights_match_a_bare_backbone_checkpoint_and_refuse_a_foreign_one(tmp_path):
    """GPT-2's original files name `h.0...`, not `transformer.h.0...`: matched either way."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = causal_lm(config=GPT2)
    bare = {k.removeprefix("transformer."): v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(bare, str(tmp_path / "bare.safetensors"))
    state = initial_weights(model, [str(tmp_path / "bare.safetensors")])
    assert torch.equal(state["transformer.wpe.weight"], model.transformer.wpe.weight)
    save_file({"something.else": torch.zeros(2)}, str(tmp_path / "foreign.safetensors"))
    with pytest.raises(CheckpointError, match="no weights for .* another architecture"):
        initial_weights(model, [str(tmp_path / "foreign.safetensors")])


def test_a_hub_name_not_on_disk_is_refused_without_a_download(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ConfigError, match=r"model.pretrained='gpt2': no such directory, and not in the Hugging Face "
                                          r"cache.*never downloads.*hf download gpt2"):
        causal_lm(pretrained="gpt2")


@pytest.mark.parametrize("kwargs,message", [
    ({"config": {"n_layer": 2}}, "model.config.model_type is missing"),
    ({"config": {"model_type": "gpt9"}}, "model.config.model_type='gpt9'"),
    ({"config": GPT2, "dtype": "float8"}, "model.dtype='float8': choose one of float32, bfloat16, float16"),
    ({"config_dir": "/nonexistent/dir", "pretrained": "/nonexistent/dir"}, "are both set"),
])
def test_bad_model_settings_are_refused_by_key(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        causal_lm(**kwargs)


def test_a_config_directory_is_that_architecture_with_overrides(tmp_path):
    causal_lm(config=GPT2).config.save_pretrained(tmp_path / "arch")
    model = causal_lm(config_dir=str(tmp_path / "arch"), config={"n_layer": 1})
    assert len(model.transformer.h) == 1 and model.config.n_embd == 32
    (tmp_path / "nocfg").mkdir()
    with pytest.raises(ConfigError, match="has no config.json"):
        causal_lm(config_dir=str(tmp_path / "nocfg"))


def test_a_pretrained_directory_is_never_resized_by_model_config(tmp_path):
    """model.pretrained=DIR with a recipe's (or the family group's) sizes left in model.config: refused
    naming each field and the directory's value, as the recipe is run; fields that leave the
    weights' shapes alone (dropout) still override; another architecture's fields are refused."""
    from framework.models.hf_causal_lm import hf_config
    from tests.helpers.in_process import run_command

    causal_lm(config={**GPT2, "n_layer": 1}).save_pretrained(tmp_path / "base")
    base = str(tmp_path / "base")
    result = run_command(["run", "hf_dpo_chat", f"model.pretrained={base}"], tmp_path)
    assert result.returncode == 2 and not (tmp_path / "outputs").exists(), result.stderr[-2000:]
    said = " ".join(result.stderr.split())
    assert f"model.pretrained={base}: model.config replaces fields of the directory's config.json (" in said
    assert "model.config.n_layer=4 (its config.json: 1)" in said and "set model.config=null" in said
    with pytest.raises(ConfigError, match=r"its config.json is a gpt2, but model.config.model_type='llama'"):
        hf_config({"model_type": "llama", "hidden_size": 64}, pretrained=base)
    kept = hf_config({"model_type": "gpt2", "resid_pdrop": 0.0, "n_layer": 1}, pretrained=base)
    assert kept.resid_pdrop == 0.0 and kept.n_layer == 1 and kept.n_embd == 32


def test_save_for_hub_writes_what_from_pretrained_loads(tmp_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    model = causal_lm(config=GPT2)
    save_for_hub(model.state_dict(), {"_target_": "framework.models.hf_causal_lm.causal_lm", "config": GPT2},
                 tmp_path / "out")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    # GPT-2's default bos/eos (50256) name no token of a 256-byte vocabulary: not written
    assert (loaded.config.bos_token_id, loaded.config.eos_token_id) == (None, None)
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "out" / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask  # as open() makes
    for name, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name


@pytest.mark.slow  # a fresh interpreter or a pool of processes (make test-fast starts none)
def test_hugging_face_libraries_are_imported_only_when_chosen():
    import subprocess
    import sys

    heavy = "('transformers', 'datasets', 'tokenizers')"
    code = ("import sys; from framework.cli import main; rc = main(['plan', {}]); "
            f"print('RC', rc, [m for m in {heavy} if m in sys.modules])")
    default = subprocess.run([sys.executable, "-c", code.format("'trainer.max_steps=1'")], capture_output=True,
                             text=True, timeout=120)
    assert "RC 0 []" in default.stdout, default.stdout + default.stderr
    chosen = subprocess.run([sys.executable, "-c", code.format("'model=hf_causal_lm', 'strategy=fsdp', 'devices=2'")],
                            capture_output=True, text=True, timeout=120)
    assert "RC 0 ['transformers'" in chosen.stdout and "GPT2LMHeadModel" in chosen.stdout, chosen.stdout + chosen.stderr


def test_a_transformers_from_pretrained_target_loads_offline_and_passes_the_meta_check(tmp_path, monkeypatch):
    """`_target_: transformers.AutoModelForCausalLM.from_pretrained` (trusted by the user) works as
    written: transformers itself refuses the meta device, so the framework's loader takes it."""
    from framework.models.build import build_model as build

    monkeypatch.setenv("FRAMEWORK_TRUST_ALLOW", "transformers.")
    torch.manual_seed(2)
    saved = causal_lm(config=GPT2)
    saved.save_pretrained(tmp_path / "pre")
    node = {"_target_": "transformers.AutoModelForCausalLM.from_pretrained",
            "pretrained_model_name_or_path": str(tmp_path / "pre")}
    whole = build(node, "model")
    assert torch.equal(whole.transformer.h[1].attn.c_attn.weight, saved.transformer.h[1].attn.c_attn.weight)
    with meta_device():
        meta = build(node, "model")
    assert all(p.is_meta for p in meta.parameters()) and meta.pretrained_weights[0].endswith("model.safetensors")
    with pytest.raises(ConfigError, match="not in the Hugging Face cache"):
        build({**node, "pretrained_model_name_or_path": "no-such-org/no-such-model"}, "model")


def test_architecture_mistakes_are_named_before_anything_is_built():
    from framework.models.hf_causal_lm import check_attention, hf_config

    with pytest.raises(ConfigError, match=r"model_type='gtp2' is not an architecture transformers .* Did you mean "
                                          r"gpt2\? List them: python -c"):
        hf_config({"model_type": "gtp2"})
    with pytest.raises(ConfigError, match=r"model.config: llama has no field n_embd, n_layer\. Fields merged from another "
                                          r"architecture\? Choose the family with model/config=llama .* llama's fields: "
                                          r"attention_bias, .*hidden_size"):
        hf_config({"model_type": "llama", "n_embd": 64, "n_layer": 2})
    with pytest.raises(ConfigError, match=r"gpt2 has no field n_layers\. For n_layers: did you mean n_layer\? gpt2's"):
        hf_config({"model_type": "gpt2", "n_layers": 2})  # a typo alone: no word about other families
    with pytest.raises(ConfigError, match=r"num_key_value_heads=3 does not divide model.config.num_attention_heads=4: "
                                          r".* choose num_key_value_heads among 1, 2, 4\."):
        hf_config({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 3})
    with pytest.raises(ConfigError, match=r"model.config.n_embd=64 is not divisible by model.config.n_head=3"):
        hf_config({"model_type": "gpt2", "n_embd": 64, "n_head": 3})
    assert hf_config({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
                      "num_key_value_heads": 2}).num_key_value_heads == 2
    check_attention("sdpa")
    if importlib.util.find_spec("flash_attn") is None:
        with pytest.raises(ConfigError, match="model.attn_implementation=flash_attention_2: needs the flash_attn package"):
            check_attention("flash_attention_2")


def test_blocks_longer_than_the_learned_positions_are_refused_by_key():
    from framework.tasks.fit_check import check_context

    with meta_device():
        short = causal_lm(config={**GPT2, "n_positions": 16})
    with pytest.raises(ConfigError, match=r"data.block_size=32: .* learned positions for 16 \(model.config.n_positions="
                                          r"16, its transformer.wpe\)\. Set data.block_size=16 or less, or "
                                          r"model.config.n_positions=32"):
        check_context(short, {"input_ids": torch.zeros(2, 32, dtype=torch.long)})
    check_context(short, {"input_ids": torch.zeros(2, 16, dtype=torch.long)})
