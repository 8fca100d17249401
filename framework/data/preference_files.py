"""Preference pairs: local JSON lines (or a JSON array, parquet, CSV) of a prompt with a chosen and a
rejected response, tokenised once into a store and served as one batch of both (`task=preference`).

A row is a pair in the shapes people have (trl's): a `prompt`, `chosen` and `rejected` as text; the
same three as chat messages (lists of {role, content}), rendered by the chat template as
data=chat_files renders conversations; or `chosen` and `rejected` as whole conversations whose
shared first messages are the prompt. Each pair is tokenised as trl tokenises it: the prompt alone
(with the template's generation prompt), then the prompt with each response; a response starts
where those token ids part (where a tokenizer merges across the boundary, the prompt's end is left
to the responses); a text response gets the tokenizer's end-of-text token. The store keeps a pair as
one document (prompt, chosen, rejected tokens, a flag each saying which), and a pair goes to
validation or testing by a hash of its row.

A batch holds its pairs' chosen sequences, then their rejected ones, right-padded to the longest:
`input_ids` (2B, T), `attention_mask`, and `labels` (-100 on the prompt and the padding), each
sequence cut to block_size tokens from its start. A pair whose prompt leaves nothing of a response
within the block follows data.drop_unscorable (refused, or left out).
"""
from __future__ import annotations

import json

import numpy as np
import torch
from torch.utils.data import Dataset

from framework.config.resolvers import BYTES
from framework.config.types import NonNegativeInt, PositiveInt
from framework.data.chat_template import ChatTemplate
from framework.data.prepare import MISSING, Encoded
from framework.data.sources import RowError, read_rows, row_place
from framework.data.store import open_split
from framework.data.stored_files import StoredFiles
from framework.data.tokenizer import loaded_tokenizer
from framework.errors import ConfigError
from framework.sequences import IGNORE_INDEX

PROMPT, CHOSEN, REJECTED = 0, 1, 2  # a stored token's flag: which part of its pair it is
CHECKED_ROWS = 20_000  # rows of each file checked before launch (the rest when the data is prepared)
TOKENISED_ROWS = 20  # of them, tokenised before launch too


def _messages(value) -> bool:
    return isinstance(value, list) and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                           and isinstance(m.get("content"), str) for m in value)


def _filled(value) -> bool:
    return (isinstance(value, str) and value.strip() != "") or (_messages(value) and len(value) > 0)


class PairFields:
    """Which fields of a row hold the pair."""

    def __init__(self, prompt: str, chosen: str, rejected: str):
        self.prompt, self.chosen, self.rejected = prompt, chosen, rejected

    def problem(self, row: dict) -> str | None:
        """What keeps `row` from being a pair (a field missing or empty, text mixed with messages), or None."""
        for field in (self.chosen, self.rejected):
            value = row.get(field)
            if value is None:
                return f"has no '{field}'"
            if value == [] or (isinstance(value, str) and not value.strip()):
                return f"has an empty '{field}'"
            if not _filled(value):
                return f"'{field}' is neither text nor a list of {{role, content}} messages"
        as_text = isinstance(row[self.chosen], str)
        if as_text != isinstance(row[self.rejected], str):
            return f"'{self.chosen}' and '{self.rejected}' are not of one kind (text and messages mixed)"
        prompt = row.get(self.prompt)
        if prompt is None:
            if as_text:
                return f"has no '{self.prompt}' (text responses need one; messages may carry it as their first turns)"
            return None
        if as_text and not (isinstance(prompt, str) and prompt.strip()):
            return f"has an empty '{self.prompt}'" if prompt in ("", []) else f"'{self.prompt}' is not text"
        if not as_text and not (_messages(prompt) and prompt):
            return f"'{self.prompt}' is not a list of {{role, content}} messages, as its responses are"
        return None

    def pair(self, row: dict) -> tuple[str | list, str | list, str | list]:
        """(prompt, chosen, rejected): text, or messages (an implicit prompt split off: the
        conversations' shared first messages, as trl's extract_prompt)."""
        chosen, rejected, prompt = row[self.chosen], row[self.rejected], row.get(self.prompt)
        if prompt is not None or isinstance(chosen, str):
            return prompt, chosen, rejected
        shared = 0
        while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
            shared += 1
        return chosen[:shared], chosen[shared:], rejected[shared:]


def _ended(tokenizer, response: str, ids: list[int]) -> list[int]:
    """A text response's ids ended as trl ends it: its eos token's text appended to a response that
    does not end with it (so before the eos a family's post-processor adds itself, if it adds one)."""
    eos, text = tokenizer.eos_id, tokenizer.special.texts.get("eos")
    if eos is None or (text is not None and response.endswith(text)) or (text is None and ids[-1:] == [eos]):
        return ids
    at = len(ids) - (1 if tokenizer.special.add_eos else 0)
    return [*ids[:at], eos, *ids[at:]]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class _EncodePairs:
    """Rows to pairs of token ids (pickled to the processes that prepare the store: every argument
    that changes the result is an attribute, and part of the store's identity)."""

    def __init__(self, tokenizer: str, template: ChatTemplate | None, fields: PairFields, block_size: int,
                 drop_unscorable: bool):
        self.tokenizer, self.fields = tokenizer, fields
        self.template_source = template.source if template is not None else None
        self.template_origin = template.origin if template is not None else None
        self.special_tokens = template.special_tokens if template is not None else {}
        self.block_size, self.drop_unscorable = block_size, drop_unscorable

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_compiled"}  # compiled again where unpickled

    def _template(self) -> ChatTemplate:
        """The chat template, compiled once per process."""
        if self.template_source is None:
            raise ConfigError("data.chat_template: chat-message pairs need a template; give one (data.chat_template="
                              "chatml, a .jinja file or a Jinja template inline).")
        if getattr(self, "_compiled", None) is None:
            self._compiled = ChatTemplate(self.template_source, self.template_origin, self.special_tokens)
        return self._compiled

    def tokenise(self, row: dict) -> tuple[list[int], list[int], list[int]] | None:
        """(prompt ids, chosen ids, rejected ids) of one pair; None when a response has nothing
        within block_size and such pairs are dropped."""
        prompt, chosen, rejected = self.fields.pair(row)
        tokenizer = loaded_tokenizer(self.tokenizer)
        if isinstance(chosen, str):  # as trl: each text with the family's bos..., a response ended by the eos
            prompt_ids, with_chosen, with_rejected = tokenizer.encode([prompt, prompt + chosen, prompt + rejected],
                                                                      special=True)
            with_chosen, with_rejected = _ended(tokenizer, chosen, with_chosen), _ended(tokenizer, rejected,
                                                                                        with_rejected)
        else:  # as trl: apply_chat_template, which adds nothing to what the template writes
            template = self._template()
            prompt_text = template.render(prompt, add_generation_prompt=True) if prompt else ""
            prompt_ids, with_chosen, with_rejected = tokenizer.encode(
                [prompt_text, template.render(prompt + chosen), template.render(prompt + rejected)])
        shared = min(_common_prefix(prompt_ids, with_chosen), _common_prefix(prompt_ids, with_rejected))
        pair = prompt_ids[:shared], with_chosen[shared:], with_rejected[shared:]
        if shared >= self.block_size or not pair[1] or not pair[2]:
            if self.drop_unscorable:
                return None
            why = (f"its prompt is {shared} tokens, data.block_size={self.block_size} or more, so no response token is "
                   "left within the block" if shared >= self.block_size else "a response adds no token to the prompt")
            preview = str(prompt if isinstance(prompt, str) else (prompt or chosen)[0]["content"])[:60]
            raise ConfigError(f"data: a pair (its prompt: {preview!r}): {why}. Raise data.block_size, shorten or "
                              "remove the pair, or set data.drop_unscorable=true to leave such pairs out.")
        return pair

    def __call__(self, path: str, rows: list) -> list:
        """A batch of a file's rows to pairs stored as one document each (for framework/data/prepare.py)."""
        out = []
        for row in rows:
            if self.fields.problem(row) is not None:
                out.append(MISSING)
                continue
            pair = self.tokenise(row)
            if pair is None:
                out.append(None)
                continue
            key = json.dumps(row, sort_keys=True, default=str).encode("utf-8")
            flags = [PROMPT] * len(pair[0]) + [CHOSEN] * len(pair[1]) + [REJECTED] * len(pair[2])
            out.append(Encoded(key, np.asarray(pair[0] + pair[1] + pair[2], dtype=np.int64),
                               np.asarray(flags, dtype=np.uint8)))
        return out


class Pairs(Dataset):
    """One pair a sample: its prompt and each response, every sequence cut to `block_size` tokens
    from its start."""

    def __init__(self, split, block_size: int):
        self.split, self.block_size = split, block_size

    def __len__(self) -> int:
        return self.split.documents

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        start, end = self.split.document(int(i))
        ids, flags = self.split.tokens(start, end), torch.from_numpy(self.split.flags(start, end).astype(np.int64))
        prompt = ids[flags == PROMPT]
        return {"prompt_ids": prompt, "chosen_ids": ids[flags == CHOSEN], "rejected_ids": ids[flags == REJECTED]}


class PairCollate:
    """Pairs to one batch: the chosen sequences, then the rejected ones (prompt + response, each cut
    to `block_size`), right-padded to the longest: input_ids (pad_id), attention_mask, labels (the
    response's tokens; -100 on the prompt and the padding)."""

    def __init__(self, pad_id: int, block_size: int):
        self.pad_id, self.block_size = pad_id, block_size

    def __call__(self, pairs: list[dict]) -> dict[str, torch.Tensor]:
        rows = [(p["prompt_ids"], p[which]) for which in ("chosen_ids", "rejected_ids") for p in pairs]
        length = min(max(len(prompt) + len(response) for prompt, response in rows), self.block_size)
        ids = torch.full((len(rows), length), self.pad_id, dtype=torch.long)
        labels = torch.full((len(rows), length), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, (prompt, response) in enumerate(rows):
            sequence = torch.cat([prompt, response])[:self.block_size]
            n, p = len(sequence), len(prompt)
            ids[i, :n], mask[i, :n] = sequence, 1
            labels[i, p:n] = sequence[p:]
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class PreferenceFiles(StoredFiles):
    """Local preference pairs (prompt, chosen, rejected), both responses of a pair in one batch."""

    #: what its batches are (framework/data/batch_kinds.py)
    batch_kind = "pairs"

    kind = "preference"
    row_fields = ("preference pairs need rows with fields (JSON lines, a JSON array, parquet or CSV), each a prompt, "
                  "a chosen and a rejected response.")

    def __init__(self, files: str | list[str], val_files: str | list[str] | None = None, val_percent: NonNegativeInt = 5,
                 test_files: str | list[str] | None = None, test_percent: NonNegativeInt = 0,
                 format: str | None = None, prompt_field: str = "prompt", chosen_field: str = "chosen",
                 rejected_field: str = "rejected", chat_template: str | None = None, tokenizer: str = BYTES,
                 block_size: PositiveInt = 512, drop_unscorable: bool = False, cache_dir: str | None = None,
                 num_proc: PositiveInt | None = None, allow_changed: bool = False, **loader):
        """files, val_files, val_percent, test_files, test_percent, format, tokenizer, cache_dir,
        num_proc, allow_changed: as data=chat_files; prompt_field, chosen_field, rejected_field: the
        fields holding a pair (text, or lists of {role, content} messages; without a prompt field,
        message responses carry the prompt as their shared first turns); chat_template: how
        messages are rendered (a built-in name, a .jinja file, Jinja inline; null: the tokenizer's
        own); block_size: tokens per sequence (prompt + a response, cut from its start);
        drop_unscorable: leave out pairs whose prompt leaves no response token within the block
        (false: refuse them)."""
        super().__init__(files=files, val_files=val_files, val_percent=val_percent, test_files=test_files,
                         test_percent=test_percent, format=format, tokenizer=tokenizer, block_size=block_size,
                         packing=False, cache_dir=cache_dir, num_proc=num_proc, allow_changed=allow_changed,
                         **loader)
        self.fields = PairFields(prompt_field, chosen_field, rejected_field)
        self.drop_unscorable = drop_unscorable
        try:
            self.template = ChatTemplate.choose(chat_template, self.tokenizer.spec)
        except ConfigError:
            if chat_template:
                raise
            self.template = None  # the tokenizer has none: text pairs need none, message pairs are refused

    def problems(self) -> list[str]:
        """Every row (up to CHECKED_ROWS a file) is a pair, named by file and line where not; each
        file's first rows tokenise within the block."""
        found = []
        for key, files in ((f"data.{role}", files) for role, files in self.roles().items()):
            for path in files:
                found += self._file_problems(key, path)
                if len(found) >= 10:
                    return found
        return found

    def _file_problems(self, key: str, path: str) -> list[str]:
        checked, encoder = 0, self.encoder()
        try:
            for position, row in read_rows(path, self.format):
                problem = self.fields.problem(row)
                if problem is not None:
                    return [f"{key}: {path}, {row_place(path, self.format, position)}: the pair {problem}; fix or remove "
                            "the row (data.prompt_field, data.chosen_field and data.rejected_field name the fields)."]
                if checked < TOKENISED_ROWS:
                    encoder.tokenise(row)
                checked += 1
                if checked >= CHECKED_ROWS:
                    break
        except (RowError, OSError) as err:
            return [f"{key}: {err}"]
        except ConfigError as err:
            return [f"{key}: {path}: {str(err).removeprefix('data: ')}"]
        return [] if checked else [f"{key}: {path} has no row; remove it from {key} or fill it."]

    def encoder(self) -> _EncodePairs:
        return _EncodePairs(self.tokenizer.spec, self.template, self.fields, self.block_size, self.drop_unscorable)

    def missing_message(self) -> str:
        return (f"data: {{count}} row(s) are not pairs: a missing or empty '{self.fields.chosen}' or "
                f"'{self.fields.rejected}', or a '{self.fields.prompt}' of another kind (the first: {{where}}); fix or "
                "remove those rows.")

    def settings(self) -> dict:
        template = self.template
        return {"template": None if template is None else [template.source, template.origin, template.special_tokens],
                "fields": [self.fields.prompt, self.fields.chosen, self.fields.rejected],
                "block_size": self.block_size, "drop_unscorable": self.drop_unscorable}

    def _dataset(self, split: str) -> Dataset:
        return Pairs(open_split(self._store, split), self.block_size)

    def collate(self):
        return PairCollate(self.tokenizer.pad_id, self.block_size)

    def example_batch(self, size: int = 2):
        """A batch of the right shape and keys (size pairs: 2 x size sequences), without reading the files."""
        ids = torch.zeros(2 * size, self.block_size, dtype=torch.long)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}

