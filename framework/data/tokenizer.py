"""Tokenizers: bytes (256 ids, no file) or a local tokenizer.json read by the `tokenizers` library,
with the special tokens of the directory that holds it as transformers' AutoTokenizer reads them
(framework/data/special_tokens.py); one loaded copy per process, and what makes two tokenizer files
one tokenizer (the ids a text becomes). Data modules, generation and the exports all read tokens
through here.

Two ways to encode, as transformers has them: `encode(texts)` gives a text's own tokens (what a chat
template's rendering is encoded with, as `apply_chat_template` does), `encode(texts, special=True)`
adds what the family puts around a text (Llama's and Gemma's bos, as `tokenizer(text)` does).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from framework.config.resolvers import BYTES, tokenizer_file
from framework.data.prepare import file_sha256
from framework.data.special_tokens import SETTINGS_FILES, SpecialTokens, post_processor, read_special_tokens
from framework.errors import ConfigError


class Tokenizer:
    """Bytes (256 ids, no file) or a local tokenizer.json (the `tokenizers` library) with its
    directory's special tokens."""

    def __init__(self, spec: str):
        self.spec = str(spec)
        self.special = SpecialTokens()
        self._tokenizer = None
        if self.spec != BYTES:
            from tokenizers import Tokenizer as HFTokenizer

            path = tokenizer_file(self.spec)
            self._tokenizer = HFTokenizer.from_file(str(path))
            self.special = read_special_tokens(path.parent, self._tokenizer)
            processor = post_processor(self.special)
            if processor is not None:
                self._tokenizer.post_processor = processor

    # ---- the special tokens -------------------------------------------------------------------------
    @property
    def bos_id(self) -> int | None:
        return self.special.ids.get("bos")

    @property
    def eos_id(self) -> int | None:
        return self.special.ids.get("eos")

    @property
    def pad_id(self) -> int:
        """The padding id: the pad token's, else the eos's (trl's and transformers' fallback), else 0."""
        ids = self.special.ids
        return next((i for i in (ids.get("pad"), ids.get("eos")) if i is not None), 0)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """The ids a generated answer stops at: the eos and generation_config.json's eos_token_id."""
        return self.special.stop_ids

    def token_id(self, token: str) -> int | None:
        """The id of one token of the vocabulary (a special token's), or None."""
        return None if self._tokenizer is None else self._tokenizer.token_to_id(token)

    # ---- encoding -----------------------------------------------------------------------------------
    def encode(self, texts: list[str], special: bool = False) -> list[list[int]]:
        """Each text's ids; `special`: with what the family puts around a text (its bos...)."""
        if self._tokenizer is None:
            return [list(text.encode("utf-8")) for text in texts]
        return [e.ids for e in self._tokenizer.encode_batch(texts, add_special_tokens=self._adds(special))]

    def _adds(self, special: bool) -> bool:
        """Whether to encode with the post-processor: asked for, and settings files say what it adds
        (a bare tokenizer.json's text gets nothing, as before they were read)."""
        return special and self.special.tokenizer_settings

    def document(self, texts: list[str], end: bool = True) -> list[np.ndarray]:
        """Each text as a document of a token stream: its ids with what the family puts around a
        text, then, with `end`, the eos where the tokenizer has one and it is not there already
        (what keeps two packed documents apart, as trl's SFTTrainer ends a text)."""
        if self._tokenizer is None:
            return [np.frombuffer(text.encode("utf-8"), dtype=np.uint8) for text in texts]
        eos = self.eos_id if end else None
        out = []
        for encoded in self._tokenizer.encode_batch(texts, add_special_tokens=self._adds(True)):
            ids = encoded.ids if eos is None or encoded.ids[-1:] == [eos] else [*encoded.ids, eos]
            out.append(np.asarray(ids, dtype=np.int64))
        return out

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """One text's own token ids and, for each, the (start, end) of the characters it covers."""
        if self._tokenizer is None:
            ids, spans = [], []
            for index, char in enumerate(text):
                encoded = char.encode("utf-8", errors="replace")
                ids += encoded
                spans += [(index, index + 1)] * len(encoded)
            return ids, spans
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        return encoding.ids, list(encoding.offsets)

    def decode(self, ids: list[int]) -> str:
        """Text of token ids (bytes that are not valid UTF-8 become U+FFFD)."""
        if self._tokenizer is None:
            return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    @property
    def vocab_size(self) -> int:
        return 256 if self._tokenizer is None else self._tokenizer.get_vocab_size()

    def sha256(self) -> str:
        """What the token ids depend on ("bytes" for bytes): the parts of the tokenizer file that
        turn text into ids (tokenizer_behaviour) and the special tokens of its directory, so a store
        outlives a save that only added a decoder setting."""
        if self._tokenizer is None:
            return BYTES
        if not self.special.tokenizer_settings:  # a bare tokenizer.json: its digest as before the settings files
            return tokenizer_behaviour(tokenizer_file(self.spec))
        # what a text gets around it: the file's own post-processor, or the flags (in the identity)
        behaviour = tokenizer_behaviour(tokenizer_file(self.spec), self.special.own_post_processor)
        identity = {"behaviour": behaviour, "special": self.special.identity()}
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()


def loaded_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer of `spec`, loaded once per process while its files are unchanged (a tokenizer
    retrained at the same path, or its settings edited, is loaded again)."""
    stamp = None
    if str(spec) != BYTES:
        try:
            path = tokenizer_file(str(spec))
            stamp = tuple((s.st_mtime_ns, s.st_size) if s else None for s in map(_stat, [
                path, *(path.parent / name for name in SETTINGS_FILES)]))
        except ConfigError:
            stamp = None
    return _loaded_tokenizer(str(spec), stamp)


def _stat(path: Path):
    try:
        return path.stat()
    except OSError:
        return None


@functools.lru_cache(maxsize=4)
def _loaded_tokenizer(spec: str, stamp) -> Tokenizer:
    return Tokenizer(spec)


# The parts of a tokenizer.json that decide which ids a text's own words become (what is added around
# a text comes from the directory's settings, counted by Tokenizer.sha256; decoding does not change
# the ids): two files that agree on these are one tokenizer, whatever else a save added
# (transformers' export writes a post_processor, a truncation or padding setting).
ENCODING_PARTS = ("model", "added_tokens", "normalizer", "pre_tokenizer")


def tokenizer_behaviour(path: str | Path, with_post_processor: bool = False) -> str:
    """A digest of what a tokenizer.json does to text: its model (vocabulary, merges, unknown token
    ...), its added and special tokens, normaliser and pre-tokeniser (and, `with_post_processor`,
    what it adds around a text); a file that is not JSON is compared by its bytes."""
    try:
        spec = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return file_sha256(path)
    parts = {part: spec.get(part) for part in (*ENCODING_PARTS, *(("post_processor",) if with_post_processor else ()))}
    model = dict(parts["model"] or {})
    if isinstance(model.get("merges"), list):  # "a b" (older files) and ["a", "b"] (newer) are one merge
        model["merges"] = [m.split(" ", 1) if isinstance(m, str) else list(m) for m in model["merges"]]
    parts["model"] = model
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode("utf-8")).hexdigest()


def tokenizer_mismatch(pretrained: str | None, data) -> str | None:
    """A tokenizer given to the data that is not the pretrained model's own (the model.pretrained
    directory holds another): the model's embedding rows would be read as other tokens. Two
    tokenizer files are one tokenizer when they turn text into the same ids (tokenizer_behaviour),
    not only when their bytes agree."""
    given = getattr(getattr(data, "tokenizer", None), "spec", None)
    if not pretrained or given is None or not os.path.isfile(os.path.join(str(pretrained), "tokenizer.json")):
        return None
    own = os.path.join(str(pretrained), "tokenizer.json")
    if given != BYTES and tokenizer_behaviour(tokenizer_file(given)) == tokenizer_behaviour(own):
        return None
    return (f"data.tokenizer={given!r} is not the tokenizer of model.pretrained ({own}): the pretrained model's "
            "embeddings belong to its own token ids. Leave data.tokenizer unset (it then follows model.pretrained), "
            "or give the pretrained model's tokenizer.")
