"""A tokenizer directory's special tokens as transformers' AutoTokenizer reads them: which text is
the beginning (bos), end (eos), padding (pad) and unknown (unk) token, their ids, what encoding a
text adds around it, and where generation stops.

Read from the files a Hugging Face directory holds beside tokenizer.json (a tokenizer.json given as a
file: the files beside it):
- tokenizer_config.json: `bos_token`, `eos_token`, `pad_token`, `unk_token` (a string, {"content":
  ...}, or null for none), `add_bos_token` / `add_eos_token`;
- special_tokens_map.json: the tokens tokenizer_config.json does not name (its own values win, as
  transformers' loading does);
- generation_config.json: `eos_token_id` (one id or a list): what a generated answer stops at,
  besides the eos (Llama 3's <|end_of_text|> and <|eot_id|>, Gemma's <end_of_turn>).
What a text gets around it is transformers 5's rule (TokenizersBackend): where tokenizer_config.json
names `add_bos_token` or `add_eos_token`, or tokenizer.json has no post-processor, the bos and eos
are added as those flags say (each off unless set); otherwise tokenizer.json's own post-processor
decides (Llama 3 adds <|begin_of_text|> so, GPT-2 and Qwen add nothing).

A bare tokenizer.json, without tokenizer_config.json or special_tokens_map.json, has no settings to
read: nothing is added to a text and the eos is the first of a few usual names in its vocabulary
(`<|endoftext|>`, `</s>`, `<eos>`, `[SEP]`), as before these files were read (a generation_config.json
beside it still adds its stops).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from framework.errors import ConfigError

TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
GENERATION_CONFIG = "generation_config.json"
SETTINGS_FILES = (TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP, GENERATION_CONFIG)
ROLES = ("bos", "eos", "pad", "unk")
#: the eos of a bare tokenizer.json (no settings files): the first of these its vocabulary holds
EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "[SEP]")


def token_text(value) -> str | None:
    """A special token as the settings files write it: a string, {"content": ...} or null."""
    return value.get("content") if isinstance(value, dict) else value


def read_json(path: Path) -> dict:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(f"data.tokenizer: {path} is not a JSON file ({err}); fix or remove it.") from err
    if not isinstance(found, dict):
        raise ConfigError(f"data.tokenizer: {path} holds {type(found).__name__}, not an object; fix or remove it.")
    return found


@dataclass(frozen=True)
class SpecialTokens:
    """The special tokens of one tokenizer: texts (None where it has none) and ids, whether a text
    gets the bos / eos when encoded with its special tokens, and the ids generation stops at."""

    texts: dict[str, str | None] = field(default_factory=dict)
    ids: dict[str, int | None] = field(default_factory=dict)
    add_bos: bool = False
    add_eos: bool = False
    #: tokenizer.json's own post-processor decides what a text gets (no flags, one is there)
    own_post_processor: bool = False
    stop_ids: tuple[int, ...] = ()
    #: the settings files read
    read_from: tuple[str, ...] = ()
    #: whether a tokenizer_config.json or special_tokens_map.json said which tokens are special and
    #: what a text gets (False: a bare tokenizer.json, as before these files were read)
    tokenizer_settings: bool = False

    def identity(self) -> dict:
        """What the token ids of a document depend on, beyond tokenizer.json's encoding parts."""
        return {"texts": self.texts, "ids": self.ids, "add_bos": self.add_bos, "add_eos": self.add_eos,
                "own_post_processor": self.own_post_processor}


def read_special_tokens(directory: Path | None, tokenizer) -> SpecialTokens:
    """The special tokens of the `tokenizers` Tokenizer `tokenizer` loaded from `directory`'s
    tokenizer.json, from the settings files there (module docstring). A token a file names that
    the vocabulary lacks is refused, naming the file and the token."""
    def present(name: str) -> bool:
        return directory is not None and (directory / name).is_file()

    stops = _generation_stops(directory / GENERATION_CONFIG, tokenizer) if present(GENERATION_CONFIG) else []
    read = tuple(name for name in SETTINGS_FILES if present(name))
    if not present(TOKENIZER_CONFIG) and not present(SPECIAL_TOKENS_MAP):  # a bare tokenizer.json: as before
        eos = next((name for name in EOS_NAMES if tokenizer.token_to_id(name) is not None), None)
        eos_id = None if eos is None else tokenizer.token_to_id(eos)
        return SpecialTokens({"bos": None, "eos": eos, "pad": None, "unk": None},
                             {"bos": None, "eos": eos_id, "pad": None, "unk": None},
                             stop_ids=tuple(dict.fromkeys(i for i in (eos_id, *stops) if i is not None)),
                             read_from=read)
    config = read_json(directory / TOKENIZER_CONFIG) if present(TOKENIZER_CONFIG) else {}
    mapped = read_json(directory / SPECIAL_TOKENS_MAP) if present(SPECIAL_TOKENS_MAP) else {}
    texts, ids = {}, {}
    for role in ROLES:
        key = f"{role}_token"
        origin = TOKENIZER_CONFIG if key in config else SPECIAL_TOKENS_MAP
        text = token_text(config[key] if key in config else mapped.get(key))
        if text is not None and not isinstance(text, str):
            raise ConfigError(f"data.tokenizer: {directory / origin} gives {key} as {text!r}: a special token is a "
                              "string, {\"content\": ...} or null.")
        token_id = None if text is None else tokenizer.token_to_id(text)
        if text is not None and token_id is None:
            raise ConfigError(f"data.tokenizer: {directory / origin} names {key}={text!r}, a token its "
                              f"tokenizer.json does not hold; add {text!r} to the tokenizer's special tokens, or name "
                              "one it holds.")
        texts[role], ids[role] = text, token_id
    flags = "add_bos_token" in config or "add_eos_token" in config
    own = not flags and tokenizer.post_processor is not None
    add_bos = bool(config.get("add_bos_token", False)) and ids["bos"] is not None
    add_eos = bool(config.get("add_eos_token", False)) and ids["eos"] is not None
    if own:  # what tokenizer.json's post-processor puts around an empty text
        added = tokenizer.encode("", add_special_tokens=True).ids
        add_bos = ids["bos"] is not None and added[:1] == [ids["bos"]]
        add_eos = ids["eos"] is not None and added[-1:] == [ids["eos"]] and (len(added) > 1 or not add_bos)
    stop_ids = tuple(dict.fromkeys(i for i in (ids["eos"], *stops) if i is not None))
    return SpecialTokens(texts, ids, add_bos, add_eos, own, stop_ids, read, tokenizer_settings=True)


def _generation_stops(path: Path, tokenizer) -> list[int]:
    """generation_config.json's eos_token_id (one id or a list), the ids of the tokenizer's
    vocabulary only: a model saved with its class's default config can name ids its tokenizer does
    not have (GPT-2's 50256 beside a tokenizer of 300), no token this tokenizer makes."""
    stops = read_json(path).get("eos_token_id")
    stops = [stops] if isinstance(stops, int) else stops if isinstance(stops, list) else []
    return [i for i in stops if isinstance(i, int) and 0 <= i < tokenizer.get_vocab_size()]


def post_processor(special: SpecialTokens):
    """The post-processor transformers puts on the tokenizer (None: keep tokenizer.json's own)."""
    if special.own_post_processor or not special.tokenizer_settings:
        return None
    from tokenizers import processors

    bos, eos = special.texts["bos"], special.texts["eos"]
    single = " ".join([*([f"{bos}:0"] if special.add_bos else []), "$A:0", *([f"{eos}:0"] if special.add_eos else [])])
    pair = " ".join([single, *([f"{bos}:1"] if special.add_bos else []), "$B:1",
                     *([f"{eos}:1"] if special.add_eos else [])])
    tokens = [*([(bos, special.ids["bos"])] if special.add_bos else []),
              *([(eos, special.ids["eos"])] if special.add_eos else [])]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=list(dict.fromkeys(tokens)))
