"""Prompts for online learning (`task=grpo`): local JSON lines (or a JSON array, parquet, CSV) of a
prompt per row, as text or as chat messages, with whatever fields the reward functions read (an
answer, a test to run).

A row's prompt is tokenised as trl's GRPOTrainer tokenises it: text with what the tokenizer's family
puts around a text (Llama's bos: `tokenizer(text)`), messages rendered by the chat template with its
generation prompt (`apply_chat_template(add_generation_prompt=True)`, nothing added). A prompt longer
than data.max_prompt_tokens keeps its last tokens (trl cuts prompts from the left). A row goes to
validation or testing by a hash of its content, as every data module here splits (framework/data/splits.py),
or to the split whose files (data.val_files, data.test_files) hold it.

The rows are small and few (a prompt set, not a corpus): read into memory, with no store. A batch is
`prompt_ids` (B, P) right-padded, `prompt_lengths` (B,), `index` (B,: the row's place in its split,
what seeds its completions: framework/tasks/grpo.py), `prompts` (as the rows give them: text or
messages) and `rows` (each row's other fields, as the rewards get them; `__row__` says its file and
line).
"""
from __future__ import annotations

import bisect
import json
import os
import re

import torch
from torch.utils.data import Dataset

from framework.config.resolvers import BYTES
from framework.config.types import NonNegativeInt, PositiveInt
from framework.data.base import DataModule
from framework.data.chat_template import ChatTemplate
from framework.data.sources import RowError, expand, file_format, open_binary, read_rows, row_place
from framework.data.splits import SplitRule
from framework.data.tokenizer import loaded_tokenizer
from framework.errors import ConfigError

#: a row's own field saying where it is (file and line): for messages, never given to a reward function
PLACE = "__row__"


def _messages(value) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value)


def _places(path: str, fmt: str, positions: list[int]) -> list[str]:
    """Each row's place as row_place says it (a JSON-lines row's line), the file read once."""
    if fmt != "jsonl":
        return [row_place(path, fmt, p) for p in positions]
    with open_binary(path) as raw:
        ends = [m.start() for m in re.finditer(b"\n", raw.read())]
    return [f"line {bisect.bisect_left(ends, p) + 1}" for p in positions]


class Prompts(Dataset):
    """One split's rows: each its prompt's token ids and its fields."""

    def __init__(self, rows: list[dict], ids: list[list[int]], prompt_field: str):
        self.rows, self.ids, self.prompt_field = rows, ids, prompt_field

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        row = self.rows[i]
        return {"prompt_ids": torch.tensor(self.ids[i], dtype=torch.long), "index": int(i),
                "prompt": row[self.prompt_field], "row": {k: v for k, v in row.items() if k != self.prompt_field}}


class PromptCollate:
    """Samples to a batch: prompt_ids right-padded with `pad_id`, their lengths, indices, the
    prompts (text or messages) and the rows' other fields."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, samples: list[dict]) -> dict:
        lengths = [len(s["prompt_ids"]) for s in samples]
        ids = torch.full((len(samples), max(lengths)), self.pad_id, dtype=torch.long)
        for i, s in enumerate(samples):
            ids[i, :lengths[i]] = s["prompt_ids"]
        return {"prompt_ids": ids, "prompt_lengths": torch.tensor(lengths, dtype=torch.long),
                "index": torch.tensor([s["index"] for s in samples], dtype=torch.long),
                "prompts": [s["prompt"] for s in samples], "rows": [s["row"] for s in samples]}


class PromptFiles(DataModule):
    """Prompt rows for task=grpo."""

    #: the batch kind it gives (framework/data/batch_kinds.py)
    batch_kind = "prompts"

    def __init__(self, files: str | list[str], val_files: str | list[str] | None = None, val_percent: NonNegativeInt = 5,
                 test_files: str | list[str] | None = None, test_percent: NonNegativeInt = 0,
                 format: str | None = None, tokenizer: str = BYTES, chat_template: str | None = None,
                 prompt_field: str = "prompt", max_prompt_tokens: PositiveInt = 256, **loader):
        """files: the prompt rows (globs, folders); val_files / test_files: splits of their own (else
        val_percent / test_percent of files' rows by a hash of each row); format: jsonl, json,
        parquet or csv (null: from the suffixes); tokenizer: `bytes` or a tokenizer.json (or its
        directory); chat_template: for prompts given as messages (null: the tokenizer's own; a
        built-in name, a .jinja file or Jinja inline); prompt_field: the field holding the prompt;
        max_prompt_tokens: a longer prompt keeps its last this many tokens (trl's max_prompt_length)."""
        super().__init__(**loader)
        if not 0 <= val_percent < 100 or (not test_files and val_percent + test_percent >= 100):
            raise ConfigError(f"data.val_percent={val_percent}, data.test_percent={test_percent}: each in [0, 100) and "
                              "their sum below 100 (some rows must be left to train on).")
        found = {role: expand(v, f"data.{role}") if v else None
                 for role, v in (("files", files), ("val_files", val_files), ("test_files", test_files))}
        self.files, self.val_files, self.test_files = found["files"], found["val_files"], found["test_files"]
        every = self.files + (self.val_files or []) + (self.test_files or [])
        self.format = file_format(every, format, "data.files")
        if self.format == "text":
            raise ConfigError("data.files: prompt rows are records (JSON lines, a JSON array, parquet or CSV), not plain "
                              "text; give files of rows with a prompt field.")
        self.rule = SplitRule(val_percent, 0 if self.test_files else test_percent, bool(self.val_files),
                              bool(self.test_files))
        self.tokenizer_spec = str(tokenizer)
        self.tokenizer = loaded_tokenizer(self.tokenizer_spec)
        self.chat_template = chat_template
        self.prompt_field = prompt_field
        self.max_prompt_tokens = max_prompt_tokens
        self._splits: dict[str, Prompts] | None = None

    # ---- the rows -----------------------------------------------------------------------------------
    def _read(self, files: list[str]) -> list[dict]:
        rows = []
        for path in files:
            read = list(read_rows(path, self.format))
            for (_, row), place in zip(read, _places(path, self.format, [position for position, _ in read])):
                if not isinstance(row, dict):
                    raise ConfigError(f"data.files: {path} holds {type(row).__name__} rows; each row must be a record "
                                      "with a prompt field.")
                rows.append({**row, PLACE: f"{os.path.basename(path)} {place}"})
        return rows

    def _rows(self) -> dict[str, list[dict]]:
        """Every row of every split (hashed where a split has no files of its own)."""
        split: dict[str, list[dict]] = {"train": [], "val": [], "test": []}
        for row in self._read(self.files):
            key = json.dumps({k: v for k, v in row.items() if k != PLACE}, sort_keys=True, default=str)
            split[self.rule.split_of(key.encode("utf-8"))[0]].append(row)
        for role, name in (("val_files", "val"), ("test_files", "test")):
            if getattr(self, role):
                split[name] = self._read(getattr(self, role))
        return split

    def problems(self) -> list[str]:
        """Rows without a prompt (or with one neither text nor messages), messages without a template."""
        found = []
        try:
            rows = [row for files in (self.files, self.val_files or [], self.test_files or [])
                    for row in self._read(files)]
        except RowError as err:
            return [str(err)]
        if not rows:
            return [f"data.files: {', '.join(self.files[:3])} hold no rows."]
        bad = [row[PLACE] for row in rows if not (isinstance(row.get(self.prompt_field), str)
                                                  and row[self.prompt_field].strip())
               and not _messages(row.get(self.prompt_field))]
        if bad:
            found.append(f"data.prompt_field={self.prompt_field!r}: {len(bad)} row(s) have no prompt there, as text or "
                         f"as a list of {{role, content}} messages (the first: {bad[0]}); fix the rows, or name the "
                         "field that holds it.")
        elif any(_messages(r[self.prompt_field]) for r in rows):
            try:
                ChatTemplate.choose(self.chat_template, self.tokenizer_spec)
            except ConfigError as err:
                found.append(f"{err} (the prompts are chat messages)")
        return found

    def field_problems(self, fields: dict[str, list[str]]) -> list[str]:
        """Rows without a field a reward function reads (`fields`: reward name -> the fields it reads)."""
        rows = [row for files in (self.files, self.val_files or [], self.test_files or []) for row in self._read(files)]
        found = []
        for reward, names in fields.items():
            for name in names:
                lacking = [row[PLACE] for row in rows if name not in row]
                if lacking:
                    found.append(f"task.rewards: the reward {reward} reads the field {name!r}, which {len(lacking)} "
                                 f"row(s) of the prompt files lack (the first: {lacking[0]}); give every row one, or "
                                 "choose a reward that reads what the rows hold.")
        return found

    # ---- tokenising ---------------------------------------------------------------------------------
    def prompt_ids(self, prompt) -> list[int]:
        """A prompt's token ids, as trl's GRPOTrainer makes them, its last max_prompt_tokens kept."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode([prompt], special=True)[0]
        else:
            template = ChatTemplate.choose(self.chat_template, self.tokenizer_spec)
            ids = self.tokenizer.encode([template.render(prompt, add_generation_prompt=True)])[0]
        return ids[-self.max_prompt_tokens:]

    def _dataset_of(self, split: str) -> Prompts | None:
        if self._splits is None:
            rows = self._rows()
            self._splits = {name: Prompts(kept, [self.prompt_ids(r[self.prompt_field]) for r in kept], self.prompt_field)
                            for name, kept in rows.items() if kept}
        return self._splits.get(split)

    def train_dataset(self) -> Dataset:
        found = self._dataset_of("train")
        if found is None:
            raise ConfigError("data: no prompt row is left to train on (every row went to validation or testing); "
                              "lower data.val_percent / data.test_percent, or give more rows.")
        return found

    def val_dataset(self) -> Dataset | None:
        return self._dataset_of("val")

    def validates(self) -> bool:
        return bool(self.val_files) or self.rule.val_percent > 0

    def test_dataset(self) -> Dataset | None:
        return self._dataset_of("test")

    @property
    def has_test_split(self) -> bool:
        return bool(self.test_files) or self.rule.test_percent > 0

    def test_split_hint(self, trained: bool) -> str:
        return "Give data.test_files (prompt rows the run never trained on), or data.test_percent=N before training."

    def collate(self):
        return PromptCollate(self.tokenizer.pad_id)

    def fingerprint(self) -> str | None:
        sizes = [(path, os.path.getsize(path)) for path in self.files + (self.val_files or []) + (self.test_files or [])]
        return json.dumps({"files": sizes, "tokenizer": self.tokenizer.sha256(), "rule": repr(self.rule),
                           "prompt_field": self.prompt_field, "max_prompt_tokens": self.max_prompt_tokens,
                           "chat_template": self.chat_template}, sort_keys=True)

    def example_batch(self, size: int = 2):
        dataset = self.train_dataset()
        return self.collate()([dataset[i] for i in range(min(size, len(dataset)))])
