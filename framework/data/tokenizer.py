"""Tokenizers: bytes (256 ids, no file) or a local tokenizer.json read by the `tokenizers` library;
one loaded copy per process, and what makes two tokenizer files one tokenizer (the ids a text
becomes). Data modules, generation and the exports all read tokens through here."""
from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from framework.config.resolvers import BYTES, tokenizer_file
from framework.data.prepare import file_sha256
from framework.errors import ConfigError

EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "[SEP]")


class Tokenizer:
    """Bytes (256 ids, no file) or a local tokenizer.json (the `tokenizers` library)."""

    def __init__(self, spec: str):
        self.spec = str(spec)
        self.eos_id: int | None = None
        self.pad_id = 0
        self._tokenizer = None
        if self.spec != BYTES:
            from tokenizers import Tokenizer as HFTokenizer

            self._tokenizer = HFTokenizer.from_file(str(tokenizer_file(self.spec)))
            ids = [self._tokenizer.token_to_id(name) for name in EOS_NAMES]
            self.eos_id = next((i for i in ids if i is not None), None)
            self.pad_id = self.eos_id if self.eos_id is not None else 0

    def token_id(self, token: str) -> int | None:
        """The id of one token of the vocabulary (a special token's), or None."""
        return None if self._tokenizer is None else self._tokenizer.token_to_id(token)

    def encode(self, texts: list[str]) -> list[list[int]]:
        if self._tokenizer is None:
            return [list(text.encode("utf-8")) for text in texts]
        return [e.ids for e in self._tokenizer.encode_batch(texts, add_special_tokens=False)]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[int]]:
        """One text's token ids and, for each, the index of the character where it starts."""
        if self._tokenizer is None:
            ids, starts = [], []
            for index, char in enumerate(text):
                encoded = char.encode("utf-8", errors="replace")
                ids += encoded
                starts += [index] * len(encoded)
            return ids, starts
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        return encoding.ids, [start for start, _ in encoding.offsets]

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
        turn text into ids (tokenizer_behaviour), so a store outlives a save that only added a
        post-processor or a decoder setting."""
        return BYTES if self._tokenizer is None else tokenizer_behaviour(tokenizer_file(self.spec))

    def encode_numpy(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's token ids as an array (bytes: its UTF-8, without a Python list per token)."""
        if self._tokenizer is None:
            return [np.frombuffer(text.encode("utf-8"), dtype=np.uint8) for text in texts]
        return [np.asarray(e.ids, dtype=np.int64) for e in self._tokenizer.encode_batch(texts, add_special_tokens=False)]


def loaded_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer of `spec`, loaded once per process while its file is unchanged (a tokenizer
    retrained at the same path is loaded again)."""
    stamp = None
    if str(spec) != BYTES:
        try:
            stat = tokenizer_file(str(spec)).stat()
            stamp = (stat.st_mtime_ns, stat.st_size)
        except (OSError, ConfigError):
            stamp = None
    return _loaded_tokenizer(str(spec), stamp)


@functools.lru_cache(maxsize=4)
def _loaded_tokenizer(spec: str, stamp) -> Tokenizer:
    return Tokenizer(spec)


# The parts of a tokenizer.json that decide which ids a text becomes (the framework encodes without
# the post-processor's special tokens, and decoding does not change the ids): two files that agree
# on these are one tokenizer, whatever else a save added (transformers' export writes a
# post_processor, a truncation or padding setting).
ENCODING_PARTS = ("model", "added_tokens", "normalizer", "pre_tokenizer")


def tokenizer_behaviour(path: str | Path) -> str:
    """A digest of what a tokenizer.json does to text: its model (vocabulary, merges, unknown token
    ...), its added and special tokens, normaliser and pre-tokeniser; a file that is not JSON is
    compared by its bytes."""
    try:
        spec = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return file_sha256(path)
    parts = {part: spec.get(part) for part in ENCODING_PARTS}
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
