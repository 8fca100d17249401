"""A fine-tune as a user makes one: a pretrained GPT-2 directory with its own BPE tokenizer (the
chat markers added as special tokens), LoRA on conversations, exported for transformers and peft.
The base's tokenizer is used unless another is named (another is refused); a marker the tokenizer
splits is warned of; the exports carry the tokenizer with its chat template and special ids."""
from __future__ import annotations

import json

import pytest
import torch

from tests.cli.helpers import framework_cmd
from tests.conftest import TINY_GPT
from tests.helpers.in_process import run_command

pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

MARKERS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _pretrained(directory, special_tokens, init_range=0.02):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from tests.helpers.text_data import stdlib_documents

    texts = stdlib_documents(30, max_chars=3000)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=special_tokens,
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    directory.mkdir(parents=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=400, n_positions=256, n_embd=32, n_layer=1,
                                                         n_head=2, initializer_range=init_range, bos_token_id=0,
                                                         eos_token_id=0)).save_pretrained(directory)


def test_a_fine_tune_reads_with_its_base_tokenizer_and_exports_what_transformers_needs(tmp_path):
    _pretrained(tmp_path / "base", MARKERS)
    _pretrained(tmp_path / "plain", MARKERS[:1])  # the end-of-text token alone: ChatML's markers split
    tiny = [o for o in TINY_GPT if not o.startswith(("model.", "data."))]
    run = ["run", "hf_lora_chat", "model.config=null", "trainer.max_steps=2", "trainer.val_every=2",
           "data.cache_dir=cache", "data.batch_size=4", *tiny]
    result = framework_cmd(*run, "model.pretrained=base", "name=chat", cwd=tmp_path, in_process=True)
    assert result.returncode == 0, result.stderr[-3000:]
    config = json.loads(json.dumps(__import__("yaml").safe_load((tmp_path / "outputs/chat/config.yaml").read_text())))
    assert config["data"]["tokenizer"] == str(tmp_path / "base")  # the base's own, unasked
    assert "WARNING: data.chat_template" not in result.stderr

    refused = framework_cmd(*run, "model.pretrained=base", "data.tokenizer=bytes", "name=bytes", cwd=tmp_path, in_process=True)
    assert refused.returncode == 2 and "data.tokenizer='bytes' is not the tokenizer of model.pretrained" in refused.stderr
    split = framework_cmd("validate", "hf_lora_chat", "model.config=null", "model.pretrained=plain", cwd=tmp_path)
    assert split.returncode == 0 and "its marker '<|im_end|>' is" in " ".join(split.stderr.split())
    assert "tokens of data.tokenizer" in split.stderr and "not one" in split.stderr

    for to in ("hf", "peft"):
        converted = run_command(["convert", "outputs/chat", f"export-{to}", "--to", to], tmp_path)
        assert converted.returncode == 0, converted.stderr
        assert "gemm_4bit" not in converted.stderr  # no bitsandbytes note on a plain LoRA export
    messages = [{"role": "user", "content": "What is os for?"}]
    for to in ("hf", "peft"):
        tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / f"export-{to}")
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text == "<|im_start|>user\nWhat is os for?<|im_end|>\n<|im_start|>assistant\n", to
        assert tokenizer.eos_token == "<|endoftext|>"
    settings = json.loads((tmp_path / "export-peft" / "adapter_config.json").read_text())
    assert settings["task_type"] == "CAUSAL_LM" and settings["base_model_name_or_path"] == str(tmp_path / "base")
    from peft import AutoPeftModelForCausalLM

    model = AutoPeftModelForCausalLM.from_pretrained(str(tmp_path / "export-peft"))  # the base found by its path
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export-hf")
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    with torch.no_grad():
        torch.testing.assert_close(model(prompt).logits, merged(prompt).logits, atol=1e-4, rtol=1e-4)
    assert merged.generate(prompt, max_new_tokens=5, do_sample=False).shape[1] > prompt.shape[1]


def test_a_merged_chat_export_stops_in_transformers_at_the_end_of_the_turn(tmp_path):
    """A chat LoRA run that learned to answer "ok", merged and exported, then loaded by transformers
    alone: generation_config.json names the template's end of turn (<|im_end|>) beside the end of
    text, so `generate` stops there by itself. (A base whose embeddings have some range: with
    GPT-2's 0.02 init a 32-wide model's logits cannot move far enough for LoRA to teach it.)"""
    _pretrained(tmp_path / "base", MARKERS, init_range=0.2)
    rows = [{"prompt": f"Say ok to number {i}.", "response": "ok"} for i in range(200)]
    (tmp_path / "ok.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = framework_cmd("run", "hf_lora_chat", "model.config=null", "model.pretrained=base", "data.files=ok.jsonl",
                        "data.cache_dir=cache", "data.batch_size=8", "data.block_size=64", "optimizer.lr=0.02",
                        "trainer.max_steps=40", "trainer.val_every=40", "trainer.progress_bar=false",
                        "trainer.plot=false", "name=ok", cwd=tmp_path, in_process=True)
    assert run.returncode == 0, run.stderr[-3000:]
    converted = run_command(["convert", "outputs/ok", "merged", "--to", "hf"], tmp_path)
    assert converted.returncode == 0, converted.stderr
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "merged")
    end, eos = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")
    settings = json.loads((tmp_path / "merged" / "generation_config.json").read_text())
    assert settings["eos_token_id"] == [eos, end]
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Say ok to number 7."}],
                                           add_generation_prompt=True, return_tensors="pt")
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    new = model.generate(prompt, max_new_tokens=40, do_sample=False)[0, prompt.shape[1]:].tolist()
    assert new[-1] == end and len(new) < 40, tokenizer.decode(new)  # stopped at its end of turn, by itself
    assert tokenizer.decode(new) == "ok<|im_end|>"


def test_a_tokenizer_saved_again_with_a_post_processor_is_the_same_tokenizer(tmp_path):
    """The folder a base was pretrained with and the tokenizer its export wrote (transformers adds a
    post_processor, which the framework never applies) turn text into the same ids: one tokenizer.
    Another vocabulary is still refused."""
    from types import SimpleNamespace

    from framework.cli.hub_tokenizer import export_tokenizer
    from framework.data.tokenizer import tokenizer_mismatch

    _pretrained(tmp_path / "tok", MARKERS)
    export_tokenizer(str(tmp_path / "tok"), tmp_path / "exported")
    exported = json.loads((tmp_path / "exported" / "tokenizer.json").read_text())
    assert exported != json.loads((tmp_path / "tok" / "tokenizer.json").read_text())  # the bytes differ
    data = SimpleNamespace(tokenizer=SimpleNamespace(spec=str(tmp_path / "tok")))
    assert tokenizer_mismatch(str(tmp_path / "exported"), data) is None
    _pretrained(tmp_path / "other", MARKERS[:1])
    other = SimpleNamespace(tokenizer=SimpleNamespace(spec=str(tmp_path / "other")))
    assert "is not the tokenizer of model.pretrained" in tokenizer_mismatch(str(tmp_path / "exported"), other)


def test_tokenizers_are_one_when_they_encode_alike_and_two_when_any_encoding_part_differs(tmp_path):
    """What a save may add or respell (truncation, padding, a decoder, merges as "a b" or ["a", "b"])
    leaves one tokenizer; another normaliser, pre-tokeniser, merge list, vocabulary or added token is another
    tokenizer (each turns some text into other ids, checked with the tokenizers library itself)."""
    from types import SimpleNamespace

    from tokenizers import Tokenizer

    from framework.data.tokenizer import tokenizer_behaviour, tokenizer_mismatch

    _pretrained(tmp_path / "tok", MARKERS)
    original = json.loads((tmp_path / "tok" / "tokenizer.json").read_text())
    text = "def main(): Return the SUM of two numbers\n"

    def saved_as(name, spec) -> str:
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokenizer.json").write_text(json.dumps(spec))
        return str(tmp_path / name)

    def edited(**changes):
        spec = json.loads(json.dumps(original))
        for key, value in changes.items():
            spec.update({key: value}) if key != "model" else spec["model"].update(value)
        return spec

    merges = original["model"]["merges"]
    respelled = [" ".join(m) if isinstance(m, list) else m.split(" ", 1) for m in merges]
    same = {"padded": edited(truncation={"max_length": 64, "strategy": "LongestFirst", "stride": 0,
                                         "direction": "Right"},
                             padding={"strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": None,
                                      "pad_id": 0, "pad_type_id": 0, "pad_token": "<|endoftext|>"}),
            "no_decoder": edited(decoder=None), "respelled": edited(model={"merges": respelled})}
    other = {"lowercased": edited(normalizer={"type": "Lowercase"}),
             "split_on_spaces": edited(pre_tokenizer={"type": "WhitespaceSplit"}),
             "fewer_merges": edited(model={"merges": merges[40:]}),
             "another_vocabulary": edited(model={"vocab": {token: (i + 7) % len(original["model"]["vocab"]) for i, token
                                                           in enumerate(original["model"]["vocab"])}}),
             # one more added token: the text's "SUM" becomes one id of its own
             "an_added_token": edited(added_tokens=[*original["added_tokens"], {
                 "id": len(original["model"]["vocab"]) + len(original["added_tokens"]), "content": "SUM",
                 "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}])}
    own = tokenizer_behaviour(tmp_path / "tok" / "tokenizer.json")
    ids = Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json")).encode(text).ids
    for name, spec in same.items():
        folder = saved_as(name, spec)
        assert tokenizer_behaviour(f"{folder}/tokenizer.json") == own, name
        assert tokenizer_mismatch(folder, SimpleNamespace(tokenizer=SimpleNamespace(spec=str(tmp_path / "tok")))) is None
    for name, spec in other.items():
        folder = saved_as(name, spec)
        assert Tokenizer.from_file(f"{folder}/tokenizer.json").encode(text).ids != ids, name  # really another
        assert tokenizer_behaviour(f"{folder}/tokenizer.json") != own, name
        refused = tokenizer_mismatch(folder, SimpleNamespace(tokenizer=SimpleNamespace(spec=str(tmp_path / "tok"))))
        assert refused and "is not the tokenizer of model.pretrained" in refused, name
