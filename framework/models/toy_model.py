"""A Hugging Face model directory at toy size, shaped like Qwen2.5-Instruct's, for trying the
path from a pretrained model to scores on a laptop (docs/walkthrough.md):

    python -m framework.models.toy_model my_model

writes config.json and random weights (a Qwen2 of 2 layers, width 64, grouped-query attention),
a byte-level BPE tokenizer trained on the Python standard library's own source (tokenizer.json),
tokenizer_config.json with the family's special tokens (no bos, <|im_end|> the eos, <|endoftext|>
the pad) and its ChatML chat template, and generation_config.json (stops at either end token).
Nothing is downloaded; the same directory on every machine with this Python (the weights from a
fixed seed). Needs transformers and tokenizers (`pip install 'framework[hf]'`).
"""
from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

import torch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _corpus(files: int = 60) -> list[str]:
    """The first `files` top-level modules of the standard library, by name: the same texts everywhere."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return [p.read_text(errors="ignore") for p in sorted(root.glob("*.py"))[:files]]


def write_tokenizer(out: Path, vocab_size: int = 512) -> dict[str, int]:
    """tokenizer.json and tokenizer_config.json; returns the special tokens' ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.train_from_iterator(_corpus(), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tokenizer.save(str(out / "tokenizer.json"))
    ids = {token: tokenizer.token_to_id(token) for token in SPECIALS}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "unk_token": None, "model_max_length": 512, "chat_template": CHATML,
        "added_tokens_decoder": {str(i): {"content": t, "special": True} for t, i in ids.items()}}, indent=1))
    return ids


def write_model(out: Path, vocab_size: int, ids: dict[str, int], seed: int = 0) -> None:
    """config.json, generation_config.json and the weights of a tiny Qwen2 from `seed`."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=None,
                                      eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.save_pretrained(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m framework.models.toy_model", description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the directory to write (new, or empty)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        print(f"{out} exists and is not empty; give a new directory.", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(out)
    write_model(out, 512, ids)
    print(f"wrote {out}: a Qwen2 of 2 layers x 64 (random weights), its tokenizer of 512 tokens, ChatML template")
    return 0


if __name__ == "__main__":
    sys.exit(main())
