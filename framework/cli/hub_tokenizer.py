"""The tokenizer half of a Hugging Face export (`framework convert --to hf` and `--to peft`): the
run's tokenizer saved the way transformers reads it (tokenizer.json, tokenizer_config.json with
its special tokens and the chat template the run trained with), and the special ids in the
model's config.json and generation_config.json, so `generate` stops at the end of text (and, for
a chat run, at the end of the assistant's turn: every end marker of the template that is one token
of the tokenizer) and `apply_chat_template` formats a conversation as the run did."""
from __future__ import annotations

import json
from pathlib import Path

from framework.config.resolvers import BYTES, tokenizer_file
from framework.data.chat_template import ChatTemplate
from framework.data.special_tokens import EOS_NAMES
from framework.data.tokenizer import loaded_tokenizer

BOS_NAMES = ("<|startoftext|>", "<|begin_of_text|>", "<s>", "<bos>", "[CLS]")
PAD_NAMES = ("<pad>", "[PAD]", "<|pad|>", "<|padding|>")


def special_tokens(spec: str) -> dict[str, tuple[str, int] | None]:
    """{"eos", "bos", "pad"}: (token, id), or None. Where the tokenizer's directory has settings
    files, theirs (framework/data/special_tokens.py); a bare tokenizer.json's are found by name, the
    beginning of text being the end-of-text token where it has no token of its own for it (GPT-2's
    convention: <|endoftext|> both ways)."""
    tokenizer = loaded_tokenizer(str(spec))
    if tokenizer.special.tokenizer_settings:
        texts, ids = tokenizer.special.texts, tokenizer.special.ids
        return {role: (texts[role], ids[role]) if texts.get(role) is not None else None for role in ("eos", "bos",
                                                                                                    "pad")}

    def first(names):
        return next(((n, tokenizer.token_id(n)) for n in names if tokenizer.token_id(n) is not None), None)

    eos = first(EOS_NAMES)
    return {"eos": eos, "bos": first(BOS_NAMES) or eos, "pad": first(PAD_NAMES)}


def export_tokenizer(spec: str | None, out: Path, max_length: int | None = None,
                     chat_template: str | None = None) -> dict[str, int | None]:
    """Save the run's tokenizer (`data.tokenizer`: a tokenizer.json or a directory holding one) into
    `out` for transformers, with its special tokens and `chat_template`; returns the special ids
    ({} for the byte-level tokenizer, which has no file and no special tokens)."""
    if not spec or spec == BYTES:
        return {}
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    source = Path(spec).expanduser()
    tokens = special_tokens(str(spec))
    if source.is_dir() and (source / "tokenizer_config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(str(source))  # a pretrained directory's own settings kept
    else:
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file(str(spec))))
    for role in ("eos", "bos", "pad"):
        if tokens[role] is not None and getattr(tokenizer, f"{role}_token", None) is None:
            setattr(tokenizer, f"{role}_token", tokens[role][0])
    if max_length:
        tokenizer.model_max_length = int(max_length)
    if chat_template:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(str(out))
    return {f"{role}_token_id": getattr(tokenizer, f"{role}_token_id", None) for role in ("eos", "bos", "pad")}


def end_marker_ids(tokenizer: str | None, template: str | None) -> list[int]:
    """The ids generation stops at: the tokenizer's own (its eos and its directory's
    generation_config.json's eos_token_id), then a chat template's end markers that are single
    tokens of the tokenizer: the end of an assistant's turn (ChatML's `<|im_end|>`, Llama 3's
    `<|eot_id|>`, Gemma's `<end_of_turn>`) and the template's `eos_token` where it writes one. A
    marker the tokenizer splits into several tokens cannot stop transformers' generate (the run
    warned of it before launch)."""
    if not tokenizer or str(tokenizer) == BYTES:
        return []
    loaded = loaded_tokenizer(str(tokenizer))
    markers = ChatTemplate(template, "the run's chat template").end_markers() if template else []
    found = [*loaded.stop_ids, *(loaded.token_id(marker) for marker in markers)]
    return list(dict.fromkeys(i for i in found if i is not None))


def write_generation_ids(out: Path, ids: dict[str, int | None], end_markers: list[int] = ()) -> None:
    """The tokenizer's special ids in the exported model's config.json, and a generation_config.json
    that stops at the end of text and at each of `end_markers` (a chat template's end of turn: a
    list of ids, which transformers' generate stops at, any of them), padding with the end of text
    where the tokenizer has no pad token."""
    from transformers import GenerationConfig

    if not ids:
        return
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    config.update(ids)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    pad = ids.get("pad_token_id") if ids.get("pad_token_id") is not None else ids.get("eos_token_id")
    stops = list(dict.fromkeys(i for i in (ids.get("eos_token_id"), *end_markers) if i is not None))
    GenerationConfig(bos_token_id=ids.get("bos_token_id"), eos_token_id=stops if len(stops) > 1 else
                     (stops[0] if stops else None), pad_token_id=pad).save_pretrained(str(out))


def run_tokenizer(config: dict) -> tuple[str | None, str | None]:
    """(the run's tokenizer, the chat template it trained with or None) from its recorded config."""
    data = (config or {}).get("data") or {}
    tokenizer = data.get("tokenizer")
    template = None
    if str(data.get("_target_", "")).endswith("ChatFiles") and tokenizer:
        template = ChatTemplate.choose(data.get("chat_template"), str(tokenizer)).source
    return tokenizer, template
