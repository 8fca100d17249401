"""Instruction and chat data: local JSON lines (or parquet, CSV) of conversations, rendered with a
chat template and tokenised so that only the responses are scored.

A row is a conversation, in the shapes people have: OpenAI's `messages` (a list of {role,
content}), ShareGPT's `conversations` (a list of {from, value}; human, gpt and system speakers),
Alpaca's `instruction` (+ `input`) and `output`, or a `prompt` and a `response` (an optional
`system` field, or data.system_prompt, goes first). Files are JSON lines or JSON arrays
(pretty-printed or not), parquet or CSV. The text is rendered with the tokenizer's chat template (framework/data/chat_template.py)
or one given in YAML; the labels are -100 everywhere but on the tokens of the scored roles'
messages (the assistant's, by default), so the loss counts responses only.

Packing (the default) puts several conversations in one row of block_size tokens, each one whole,
with position_ids that start again at 0 for each: the built-in GPT and Hugging Face's models
(transformers' packed-sequence masks) then keep conversations from attending to each other. A
model that takes no position_ids is refused with packing; data.packing=false gives each
conversation a row of its own, padded per batch.

Files are read as for data=text_files (JSON lines, JSON arrays pretty-printed or not, parquet,
CSV, compressed or not) and prepared once into the same kind of store, with a flag per token
saying whether the loss scores it; a conversation goes to validation or testing by a hash of its
row.
"""
from __future__ import annotations

import json
from typing import Literal

import numpy as np
import torch

from framework.config.resolvers import BYTES
from framework.config.types import NonNegativeInt, PositiveInt
from framework.data.chat_template import ChatTemplate
from framework.data.prepare import MISSING, Encoded
from framework.data.store import Documents, PackedDocuments, open_split
from framework.data.stored_files import StoredFiles, first_rows
from framework.data.tokenizer import loaded_tokenizer
from framework.errors import ConfigError
from framework.sequences import IGNORE_INDEX

CHECKED_ROWS = 20  # rows of each file rendered before launch (the rest when the data is prepared)


# ShareGPT's speakers (`from`), as the chat template's roles
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
                  "model": "assistant", "system": "system", "tool": "tool", "function": "tool", "observation": "tool"}


class Fields:
    """Which fields of a row hold the conversation, in the shapes people have: OpenAI's messages
    (a list of {role, content}), ShareGPT's conversations (a list of {from, value}, speakers human,
    gpt and system), Alpaca's instruction (+ input) and output, or a prompt and a response."""

    def __init__(self, messages: str, prompt: str, response: str, system: str, system_prompt: str | None):
        self.messages, self.prompt, self.response, self.system = messages, prompt, response, system
        self.system_prompt = system_prompt

    def names(self) -> str:
        return (f"'{self.messages}' (a list of {{role, content}}: OpenAI's), 'conversations' (a list of {{from, value}}: "
                f"ShareGPT's), 'instruction' and 'output' (with an optional 'input': Alpaca's), nor '{self.prompt}' "
                f"and '{self.response}'")

    def holds_conversation(self, columns) -> bool:
        return (self.messages in columns or "conversations" in columns or ("instruction" in columns and "output"
                in columns) or (self.prompt in columns and self.response in columns))

    def conversation(self, row: dict) -> list[dict]:
        """The row's messages as [{role, content}], the system prompt first where it has none."""
        listed = row.get(self.messages) if row.get(self.messages) is not None else row.get("conversations")
        if listed is not None:
            messages = self._listed(listed, self.messages if row.get(self.messages) is not None else "conversations")
        elif row.get("instruction") is not None and row.get("output") is not None:
            question = str(row["instruction"]) + (f"\n\n{row['input']}" if row.get("input") else "")
            messages = [{"role": "user", "content": question}, {"role": "assistant", "content": str(row["output"])}]
            if row.get(self.system):
                messages.insert(0, {"role": "system", "content": str(row[self.system])})
        elif row.get(self.prompt) is not None and row.get(self.response) is not None:
            messages = [{"role": "user", "content": str(row[self.prompt])},
                        {"role": "assistant", "content": str(row[self.response])}]
            if row.get(self.system):
                messages.insert(0, {"role": "system", "content": str(row[self.system])})
        else:
            raise ConfigError(f"data: a row holds neither {self.names()} (it has {', '.join(row) or 'no field'}); "
                              "set data.messages_field, or data.prompt_field and data.response_field, to the "
                              "fields that hold the conversation.")
        if self.system_prompt and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    @staticmethod
    def _listed(listed, field: str) -> list[dict]:
        """A list of turns: OpenAI's {role, content} or ShareGPT's {from, value}."""
        if not isinstance(listed, list) or not all(isinstance(m, dict) for m in listed):
            raise ConfigError(f"data.messages_field={field!r}: a row's turns must be a list of objects, {{role, "
                              f"content}} (OpenAI's) or {{from, value}} (ShareGPT's); one row has {str(listed)[:80]!r}.")
        messages = []
        for turn in listed:
            if isinstance(turn.get("role"), str) and isinstance(turn.get("content"), str):
                messages.append({"role": turn["role"], "content": turn["content"]})
            elif isinstance(turn.get("from"), str) and isinstance(turn.get("value"), str):
                role = SHAREGPT_ROLES.get(turn["from"].lower())
                if role is None:
                    raise ConfigError(f"data: a ShareGPT turn is from {turn['from']!r}, a speaker not known (known: "
                                      f"{', '.join(SHAREGPT_ROLES)}); rename it in the data.")
                messages.append({"role": role, "content": turn["value"]})
            else:
                raise ConfigError(f"data.messages_field={field!r}: a turn must be {{role, content}} (OpenAI's) or "
                                  f"{{from, value}} (ShareGPT's) with text values; one is {str(turn)[:80]!r}.")
        return messages


def _preview(messages: list[dict]) -> str:
    text = next((m["content"] for m in messages if m["role"] != "system"), "")
    return repr(text[:60] + ("..." if len(text) > 60 else ""))


class _RenderChat:
    """Rows to input_ids and labels (pickled to the processes that prepare the store: every
    argument that changes the result is an attribute, and part of the store's identity)."""

    def __init__(self, tokenizer: str, template: ChatTemplate, fields: Fields, scored_roles: list[str],
                 scored_turns: str, block_size: int, drop_unscorable: bool):
        self.tokenizer, self.fields, self.scored_roles = tokenizer, fields, list(scored_roles)
        self.scored_turns = scored_turns
        self.template_source, self.template_origin = template.source, template.origin
        self.special_tokens = template.special_tokens
        self.block_size, self.drop_unscorable = block_size, drop_unscorable

    def tokenise(self, row: dict, template: ChatTemplate) -> tuple[list[int], list[int]] | None:
        """(input_ids, labels) of one conversation, cut to block_size; None when nothing in the
        block is scored and such rows are dropped."""
        messages = self.fields.conversation(row)
        text, spans = template.scored_text(messages, self.scored_roles, last_only=self.scored_turns == "last")
        ids, offsets = loaded_tokenizer(self.tokenizer).encode_with_offsets(text)
        scored = [any(start < e and end > s for s, e in spans) for start, end in offsets]  # overlapping a span
        labels = [t if keep else IGNORE_INDEX for t, keep in zip(ids, scored)]
        if labels:
            labels[0] = IGNORE_INDEX  # no token predicts a row's first
        ids, labels = ids[:self.block_size], labels[:self.block_size]
        if all(label == IGNORE_INDEX for label in labels):
            if self.drop_unscorable:
                return None
            why = (f"has no message of a scored role ({', '.join(self.scored_roles)})" if not spans else
                   f"is {len(offsets)} tokens, longer than data.block_size={self.block_size}, and no response starts "
                   "within the block")
            raise ConfigError(f"data: a conversation (its first message: {_preview(messages)}) {why}: nothing in it "
                              "is left to score. Raise data.block_size, shorten or remove it, or set "
                              "data.drop_unscorable=true to leave such conversations out.")
        return ids, labels

    def __call__(self, path: str, rows: list) -> list:
        """A batch of a file's rows to documents: each conversation's tokens and scored flags, its
        split chosen by a hash of the row (for the store: framework/data/prepare.py)."""
        template = ChatTemplate(self.template_source, self.template_origin, self.special_tokens)
        out = []
        for row in rows:
            if not self.fields.holds_conversation(row):
                out.append(MISSING)
                continue
            tokenised = self.tokenise(row, template)
            if tokenised is None:
                out.append(None)
                continue
            ids, labels = tokenised
            key = json.dumps(row, sort_keys=True, default=str).encode("utf-8")
            out.append(Encoded(key, np.asarray(ids, dtype=np.int64),
                               np.asarray([label != IGNORE_INDEX for label in labels], dtype=np.uint8)))
        return out


class ChatFiles(StoredFiles):
    """Local conversations, rendered with a chat template, responses scored."""

    #: what its batches are (framework/data/batch_kinds.py)
    batch_kind = "tokens"

    kind = "chat"
    row_fields = ("chat data needs rows with fields (JSON lines, a JSON array, parquet or CSV), each a conversation; "
                  "plain text is data=text_files.")

    def __init__(self, files: str | list[str], val_files: str | list[str] | None = None, val_percent: NonNegativeInt = 5,
                 test_files: str | list[str] | None = None, test_percent: NonNegativeInt = 0,
                 format: str | None = None, messages_field: str = "messages", prompt_field: str = "prompt",
                 response_field: str = "response", system_field: str = "system", system_prompt: str | None = None,
                 chat_template: str | None = None, scored_roles: list[str] | None = None,
                 scored_turns: Literal["all", "last"] = "all", tokenizer: str = BYTES,
                 block_size: PositiveInt = 512, packing: bool = True, drop_unscorable: bool = False,
                 cache_dir: str | None = None, num_proc: PositiveInt | None = None, allow_changed: bool = False,
                 **loader):
        """files, val_files, val_percent, test_files, test_percent, format, tokenizer, cache_dir,
        num_proc, allow_changed: as data=text_files (format: jsonl, json, parquet or csv); messages_field: the field
        holding a conversation as a list of {role, content}; prompt_field, response_field: the
        fields of a one-turn row (used when a row has no messages); system_field: a one-turn
        row's optional system message; system_prompt: a system message put first in every
        conversation that has none (null: none); chat_template: a built-in template's name
        (chatml), a .jinja file, or a Jinja template inline (null: the tokenizer's own, from its
        tokenizer_config.json or chat_template.jinja); scored_roles: the roles whose messages the
        loss counts (null: [assistant]); scored_turns: all (every message of a scored role: where the
        template marks the assistant's text with {% generation %}, those blocks, as trl's
        assistant_only_loss) or last (the last of them alone: trl's completion_only_loss, the
        prompt being all that comes before); block_size: tokens per row (a longer conversation is cut);
        packing: several whole conversations per row, kept apart by position_ids (false: one per
        row, padded per batch); drop_unscorable: leave out conversations with nothing to score
        within the block (false: refuse them). Chat data is always prepared (a conversation's
        rendering and its scored tokens are worked out once): streaming is data=text_files's."""
        super().__init__(files=files, val_files=val_files, val_percent=val_percent, test_files=test_files,
                         test_percent=test_percent, format=format, tokenizer=tokenizer, block_size=block_size,
                         packing=packing, cache_dir=cache_dir, num_proc=num_proc, allow_changed=allow_changed,
                         **loader)
        self.fields = Fields(messages_field, prompt_field, response_field, system_field, system_prompt)
        self.scored_roles = list(scored_roles or ["assistant"])
        if scored_turns not in ("all", "last"):
            raise ConfigError(f"data.scored_turns={scored_turns!r}: choose all (every response) or last (the last "
                              "response of each conversation alone).")
        self.scored_turns = scored_turns
        self.drop_unscorable = drop_unscorable
        self.template = ChatTemplate.choose(chat_template, self.tokenizer.spec)

    def problems(self) -> list[str]:
        """Each file's first rows: fields that hold a conversation, conversations the template
        renders (roles it knows), something to score within the block."""
        found = []
        for key, files in ((f"data.{role}", files) for role, files in self.roles().items()):
            for path in files:
                rows = first_rows(path, self.format, CHECKED_ROWS)
                if isinstance(rows, str):
                    found.append(f"{key}: {path}: {rows}.")
                    continue
                if not rows:
                    found.append(f"{key}: {path} has no row; remove it from {key} or fill it.")
                    continue
                if not self.fields.holds_conversation(rows[0]):
                    found.append(f"{key}: {path}'s rows have neither {self.fields.names()} (its first row has "
                                 f"{', '.join(rows[0]) or 'no field'}); set data.messages_field, or "
                                 "data.prompt_field and data.response_field, to the fields that hold the "
                                 "conversation.")
                    continue
                try:
                    for row in rows:
                        self._renderer().tokenise(row, self.template)
                except ConfigError as err:
                    found.append(f"{key}: {path}: {str(err).removeprefix('data: ')}")
                if len(found) >= 10:
                    return found + [f"{key}: (more files not checked after 10 problems)"]
        return found

    def warnings(self) -> list[str]:
        """Each marker of the template (`<|im_end|>`, ...) that the tokenizer does not hold as one
        token: a reply then ends with several tokens the model learns one by one, and a generator
        that stops at one id (transformers') never stops at the end of a turn."""
        if self.tokenizer.spec == BYTES:
            return []  # bytes hold no token longer than a byte: every marker is spelled out, byte by byte, by design
        found = []
        for marker in self.template.markers():
            ids = self.tokenizer.encode([marker])[0]
            if len(ids) != 1:
                found.append(f"data.chat_template: its marker {marker!r} is {len(ids)} tokens of data.tokenizer "
                             f"({self.tokenizer.spec}), not one, so a reply's end is never one token and transformers' "
                             "generate never stops at it. Add the template's markers to the tokenizer as special "
                             f"tokens (special_tokens=[..., {', '.join(repr(m) for m in self.template.markers())}] "
                             "when training it, as docs/your-model.md does), or use the tokenizer's own template.")
        return found

    def _renderer(self) -> _RenderChat:
        return _RenderChat(self.tokenizer.spec, self.template, self.fields, self.scored_roles, self.scored_turns,
                           self.block_size, self.drop_unscorable)

    def encoder(self):
        return self._renderer()

    def missing_message(self) -> str:
        names = self.fields.names().replace("{", "{{").replace("}", "}}")  # a template: {count} and {where} filled in
        return (f"data: {{count}} row(s) hold neither {names} (the first: {{where}}); set "
                "data.messages_field, or data.prompt_field and data.response_field, to the fields that hold the "
                "conversation, or fix those rows.")

    def settings(self) -> dict:
        fields = self.fields
        return {"template": [self.template.source, self.template.origin, self.template.special_tokens],
                "fields": [fields.messages, fields.prompt, fields.response, fields.system, fields.system_prompt],
                "scored_roles": self.scored_roles, "scored_turns": self.scored_turns, "block_size": self.block_size,
                "drop_unscorable": self.drop_unscorable}

    def _dataset(self, split: str):
        view = open_split(self._store, split)
        if self.packing:
            return PackedDocuments(view, self.block_size, self.tokenizer.pad_id)
        return Documents(view, self.block_size)

    #: with packing, its rows carry position_ids (the compatibility table refuses strategies that
    #: cannot pass them on)
    packs_with_position_ids = True

    def example_batch(self, size: int = 2):
        """A batch of the right shape and keys, without reading the files."""
        ids = torch.zeros(size, self.block_size, dtype=torch.long)
        if self.packing:
            return {"input_ids": ids, "labels": ids, "position_ids": torch.arange(self.block_size).repeat(size, 1)}
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
