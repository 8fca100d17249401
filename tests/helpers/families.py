"""Tokenizer directories shaped like five real model families' (their special tokens, config files,
post-processors and chat templates as those families ship them), each trained here on a little of the
standard library's source with the `tokenizers` library: nothing is downloaded. Tests compare what
the framework makes of them with what transformers' AutoTokenizer and trl make of them.

- gpt2: byte-level BPE, <|endoftext|> as bos, eos and unk, nothing added to a text, no chat template;
- llama2 (Llama 2 and Mistral): SentencePiece-style (a ▁ for each space, byte fallback), <s> added
  before a text by the post-processor and `add_bos_token`, </s> the eos, an [INST] template that
  writes the bos itself;
- llama3: byte-level, <|begin_of_text|> added by the post-processor (no add_bos_token key),
  <|eot_id|> the eos of the instruct model, generation_config.json stopping at <|end_of_text|> too;
- qwen2.5 (Qwen2.5-Instruct): byte-level, no bos at all, <|im_end|> the eos, <|endoftext|> the pad,
  ChatML;
- gemma: SentencePiece-style, <pad> <eos> <bos> <unk> as ids 0-3, <bos> added, <end_of_turn> in the
  template and in generation_config.json's stops.
"""
from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.text_data import stdlib_documents

FAMILIES = ("gpt2", "llama2", "llama3", "qwen2.5", "gemma")

LLAMA2_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token }}{% endif %}{% endfor %}")
LLAMA3_TEMPLATE = (
    "{{- bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + "
    "message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")


# Qwen2's pre-tokenising expression (its tokenizer.json's Split), before a byte-level step without its own
QWEN_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
              r"""\s*[\r\n]+|\s+(?!\S)|\s+""")


def _byte_level(specials: list[str], texts: list[str], vocab_size: int, qwen: bool = False):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if qwen:
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tokenizer


def _sentencepiece(specials: list[str], unk: str, texts: list[str], vocab_size: int, gemma: bool = False):
    """Llama 2's shape (a ▁ put before the text), or with `gemma` Gemma's (no ▁ put first)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=unk, byte_fallback=True, fuse_unk=True))
    if gemma:
        tokenizer.normalizer = normalizers.Replace(" ", "▁")
        tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
        tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    else:  # Mistral's tokenizer.json, and what transformers 5 makes of Llama 2's (legacy=false)
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                               decoders.Strip(" ", 1, 0)])
    alphabet = [f"<0x{b:02X}>" for b in range(256)]
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials + alphabet))
    return tokenizer


def _bos_first(tokenizer, bos: str, previous=None):
    from tokenizers import processors

    template = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                             special_tokens=[(bos, tokenizer.token_to_id(bos))])
    return template if previous is None else processors.Sequence([previous, template])


def make_family(family: str, directory: Path, vocab_size: int = 400) -> Path:
    """A tokenizer directory shaped like `family`'s (one of FAMILIES): tokenizer.json,
    tokenizer_config.json and, where the family ships one, generation_config.json."""
    from tokenizers import processors

    texts = stdlib_documents(12, 3000)
    directory.mkdir(parents=True, exist_ok=True)
    generation = None
    if family == "gpt2":
        tokenizer = _byte_level(["<|endoftext|>"], texts, vocab_size)
        config = {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                  "unk_token": "<|endoftext|>", "add_prefix_space": False, "model_max_length": 1024}
    elif family == "llama2":
        tokenizer = _sentencepiece(["<unk>", "<s>", "</s>"], "<unk>", texts, vocab_size)
        tokenizer.post_processor = _bos_first(tokenizer, "<s>")
        config = {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False,
                  "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None, "legacy": False,
                  "chat_template": LLAMA2_TEMPLATE}
    elif family == "llama3":
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
        tokenizer = _byte_level(specials, texts, vocab_size)
        tokenizer.post_processor = _bos_first(tokenizer, "<|begin_of_text|>", processors.ByteLevel(trim_offsets=False))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
                  "eos_token": "<|eot_id|>", "chat_template": LLAMA3_TEMPLATE, "model_max_length": 131072}
        generation = {"bos_token_id": tokenizer.token_to_id("<|begin_of_text|>"),
                      "eos_token_id": [tokenizer.token_to_id("<|end_of_text|>"), tokenizer.token_to_id("<|eot_id|>")]}
    elif family == "qwen2.5":
        tokenizer = _byte_level(["<|endoftext|>", "<|im_start|>", "<|im_end|>"], texts, vocab_size, qwen=True)
        config = {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>",
                  "pad_token": "<|endoftext|>", "unk_token": None, "add_prefix_space": False, "errors": "replace",
                  "split_special_tokens": False, "chat_template": CHATML_TEMPLATE}
        generation = {"eos_token_id": [tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")],
                      "pad_token_id": tokenizer.token_to_id("<|endoftext|>")}
    elif family == "gemma":
        tokenizer = _sentencepiece(["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"], "<unk>",
                                   texts, vocab_size, gemma=True)
        tokenizer.post_processor = _bos_first(tokenizer, "<bos>")
        config = {"tokenizer_class": "GemmaTokenizer", "add_bos_token": True, "add_eos_token": False,
                  "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
                  "chat_template": GEMMA_TEMPLATE}
        generation = {"bos_token_id": 2, "eos_token_id": [1, tokenizer.token_to_id("<end_of_turn>")],
                      "pad_token_id": 0}
    else:
        raise ValueError(f"unknown family {family!r}: one of {', '.join(FAMILIES)}")
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    if generation is not None:
        (directory / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return directory
