"""`framework convert --to hf` of a run with its own BPE tokenizer: the export carries the
tokenizer's special ids (config.json, generation_config.json, tokenizer_config.json), so that
transformers' generate, on the export alone, stops at the end of text."""
from __future__ import annotations

import json

import pytest

from tests.cli.helpers import framework_cmd
from tests.helpers.text_data import train_tokenizer, write_jsonl

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

TINY_GPT2 = "+model.config={model_type: gpt2, vocab_size: 280, n_positions: 64, n_embd: 32, n_layer: 1, n_head: 2}"


def test_an_exported_model_generates_until_the_end_of_text(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sentence = "the cat sat on the mat"
    # each a document, <|endoftext|> after it (validation in a file of its own: copies of one document are
    # held out together, by its hash)
    write_jsonl(tmp_path / "corpus" / "part.jsonl", [sentence] * 400)
    write_jsonl(tmp_path / "val" / "part.jsonl", [sentence] * 40)
    train_tokenizer(tmp_path / "tok", [sentence, "abcdefghijklmnopqrstuvwxyz"], vocab_size=280)
    result = framework_cmd("train", "model=hf_causal_lm", TINY_GPT2, "data=text_files", "data.files=corpus/part.jsonl",
                           "data.val_files=val/part.jsonl", "data.cache_dir=cache",
                           "data.tokenizer=tok", "data.block_size=32", "trainer.max_steps=40", "trainer.val_every=40",
                           "trainer.progress_bar=false", "trainer.plot=false", "optimizer.lr=1e-2", "name=eos",
                           cwd=tmp_path, in_process=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    result = framework_cmd("convert", "outputs/eos", "exported", "--to", "hf", cwd=tmp_path, in_process=True)
    assert result.returncode == 0, result.stderr

    exported = tmp_path / "exported"
    eos = json.loads((exported / "tokenizer.json").read_text())["added_tokens"][0]
    assert eos["content"] == "<|endoftext|>"
    for name in ("config.json", "generation_config.json"):
        ids = json.loads((exported / name).read_text())
        assert ids["eos_token_id"] == ids["bos_token_id"] == eos["id"], name
    tokenizer = AutoTokenizer.from_pretrained(exported)
    model = AutoModelForCausalLM.from_pretrained(exported)
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.model_max_length == 64
    prompt = tokenizer("the cat", return_tensors="pt").input_ids
    out = model.generate(prompt, max_new_tokens=40, do_sample=False)[0].tolist()
    assert out[-1] == eos["id"] and len(out) < prompt.shape[1] + 40  # stopped at the end of text, by itself
    text = tokenizer.decode(out)
    assert text.startswith("the cat") and text.endswith("<|endoftext|>") and text.count("<|endoftext|>") == 1
