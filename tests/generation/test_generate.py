"""Generation: the GPT's KV cache computes what the full forward computes, sampling filters and
seeds behave, and `framework generate` writes the same text at every call, from a run, a
checkpoint or a Hugging Face directory (there through transformers' own generate)."""
from __future__ import annotations

import json

import pytest
import torch

from framework.cli import main as framework_main
from framework.generation.decode import generate
from framework.models.gpt import GPT
from framework.sampling import Sampling, filter_logits, next_tokens
from tests.conftest import TINY_GPT, checkpoints, run_inprocess
from tests.helpers.text_data import stdlib_documents, train_tokenizer


def small_gpt(block_size: int = 16) -> GPT:
    torch.manual_seed(0)
    return GPT(n_layer=2, n_embd=32, n_head=2, block_size=block_size).eval()


def test_the_kv_cache_gives_the_full_forwards_logits_in_any_chunks():
    model = small_gpt()
    x = torch.randint(0, 256, (2, 14))
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache(2)
        chunks = [model(x[:, a:b], cache=cache) for a, b in ((0, 5), (5, 9), (9, 10), (10, 14))]
    assert cache.length == 14
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="exceeds model.block_size=16"):
        model(x[:, :3], cache=cache)


def test_top_k_and_top_p_keep_the_likeliest_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.05, 0.3, 0.15]]))
    assert torch.isfinite(filter_logits(logits, 2, None)).tolist() == [[True, False, True, False]]
    # nucleus 0.8: 0.5 + 0.3 reach it, so 0.15 and 0.05 are dropped; 0.81 needs 0.15 too
    assert torch.isfinite(filter_logits(logits, None, 0.8)).tolist() == [[True, False, True, False]]
    assert torch.isfinite(filter_logits(logits, None, 0.81)).tolist() == [[True, False, True, True]]
    assert torch.isfinite(filter_logits(logits, None, 0.1)).tolist() == [[True, False, False, False]]
    assert torch.equal(filter_logits(logits, None, 1.0), logits)
    greedy = next_tokens(logits, Sampling(temperature=0), torch.Generator())
    assert greedy.tolist() == [0]
    draws = [next_tokens(logits.expand(2000, 4), Sampling(top_p=0.8), torch.Generator().manual_seed(1))]
    counts = torch.bincount(draws[0], minlength=4).double() / 2000
    assert counts[1] == 0 and counts[3] == 0 and counts[0] == pytest.approx(0.625, abs=0.04)  # 0.5 / 0.8
    assert [Sampling(top_p=0).problems(), Sampling(top_k=0).problems(), Sampling(temperature=-1).problems()] == [
        ["--top-p=0: must be in (0, 1] (1 keeps every token; leave it out for the same)."],
        ["--top-k=0: must be at least 1 (leave it out to sample among all tokens)."],
        ["--temperature=-1: must be 0 (greedy) or positive."]]


@pytest.mark.parametrize("sampling", [Sampling(temperature=0, max_new_tokens=20),
                                      Sampling(temperature=0.9, top_k=50, top_p=0.95, seed=7, max_new_tokens=20)])
def test_cached_decoding_writes_what_recomputing_writes_also_past_the_context(sampling):
    model = small_gpt(block_size=16)
    prompt = list(b"def f(x):")  # 9 tokens + 20 new: the window slides past 16
    cached = generate(model, prompt, sampling)
    recomputed = generate(model, prompt, sampling, use_cache=False)
    assert cached.ids == recomputed.ids and len(cached.ids) == 20
    assert generate(model, prompt, sampling).ids == cached.ids  # the same seed, the same text


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gen") / "run"
    run_inprocess(TINY_GPT + ["trainer.max_steps=6", "trainer.val_every=3"], out)
    return out


def test_framework_generate_repeats_itself_and_refuses_what_cannot_work(tiny_run, tmp_path, capsys):
    outputs = []
    for name in ("a", "b"):
        args = ["generate", str(tiny_run), "--prompt", "import os", "--prompt", "class A", "--seed", "5",
                "--top-k", "40", "--max-new-tokens", "12", "-o", str(tmp_path / f"{name}.jsonl")]
        assert framework_main(args) == 0
        outputs.append([json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()])
    assert outputs[0] == [{**row, "tokens_per_s": outputs[0][i]["tokens_per_s"]} for i, row in enumerate(outputs[1])]
    assert [row["new_tokens"] for row in outputs[0]] == [12, 12] and outputs[0][0]["prompt"] == "import os"
    out = capsys.readouterr()
    assert "import os" + outputs[0][0]["completion"] in out.out and "best val/loss=" in out.err
    # a given checkpoint, greedy, a prompts file
    (tmp_path / "prompts.txt").write_text("for i in\n\nwhile True:\n")
    assert framework_main(["generate", str(checkpoints(tiny_run)[-1]), "--prompts", str(tmp_path / "prompts.txt"),
                           "--greedy", "--max-new-tokens", "4", "-o", str(tmp_path / "g.jsonl")]) == 0
    assert [json.loads(r)["prompt"] for r in (tmp_path / "g.jsonl").read_text().splitlines()] == ["for i in",
                                                                                                "while True:"]
    tokenizer = train_tokenizer(tmp_path / "tok", stdlib_documents(10, max_chars=2000))
    cases = [
        (["--prompt", "x", "--top-p", "1.5"], "--top-p=1.5: must be in (0, 1]"),
        (["--prompt", "x" * 40], "the prompt is 40 tokens, longer than the model's context of 32"),
        (["--prompt", "x", "--tokenizer", str(tokenizer)], "has 300 tokens, the model's vocabulary 256"),
        ([], "no prompt; give --prompt TEXT or --prompts FILE"),
    ]
    capsys.readouterr()
    for args, fragment in cases:
        assert framework_main(["generate", str(tiny_run), *args]) == 2
        assert fragment in capsys.readouterr().err
    assert framework_main(["generate", str(tmp_path), "--prompt", "x"]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_a_hugging_face_directory_generates_what_transformers_generates(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    tokenizer_dir = train_tokenizer(tmp_path / "hf", stdlib_documents(10, max_chars=2000))
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(tokenizer_dir)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    ids = tokenizer.encode("import sys", add_special_tokens=False).ids
    expected = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=10, do_sample=False, pad_token_id=0)[0, len(ids):].tolist()
    rows = []
    for sampled in ([], ["--seed", "3", "--top-p", "0.9"], ["--seed", "3", "--top-p", "0.9"]):
        assert framework_main(["generate", str(tokenizer_dir), "--prompt", "import sys", "--no-stop",
                               "--max-new-tokens", "10", "-o", str(tmp_path / "o.jsonl"),
                               *(sampled or ["--greedy"])]) == 0
        rows.append(json.loads((tmp_path / "o.jsonl").read_text()))
    assert rows[0]["new_tokens"] == 10 and rows[0]["completion"] == tokenizer.decode(expected, skip_special_tokens=False)
    assert rows[1]["completion"] == rows[2]["completion"] != rows[0]["completion"]  # seeded: the same each call
