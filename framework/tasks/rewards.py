"""Reward functions for task=grpo: the built-in ones, and how any of them is called.

A reward function is called as trl's GRPOTrainer calls one: with keyword arguments `prompts` (the
prompts as text, or as chat messages where the data gives messages), `completions` (the generated
texts), `completion_ids` (their token ids), and every other field of the prompt file's rows, each as
a list with one value per completion (a prompt's row repeated for each of its num_generations
completions). It returns one float per completion (None: no opinion; a completion no function scores
gets no advantage). Its weighted sum over the functions (task.reward_weights) is the reward.

Built-in, by name in task.rewards (or as a `_target_` with settings):
- `exact_match`: 1 where the completion's final answer equals the row's `answer` field, else 0
  (framework.tasks.rewards.ExactMatch: `field`, and how the final answer is found);
- `format`: 1 where the completion matches a regular expression, else 0
  (framework.tasks.rewards.Format: `pattern`; by default an answer after "####" on the last line);
- `length`: -|characters - target| / target (framework.tasks.rewards.Length: `target`, 64 by default).
A function of one's own is a trusted `_target_` (docs/trust.md): a class whose instances are called
so, or a function given with `_partial_: true`.
"""
from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Sequence

from framework.data.prompt_files import PLACE
from framework.errors import ConfigError

#: the keyword arguments every reward function is given besides the rows' fields
GIVEN = ("prompts", "completions", "completion_ids")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_answer(text: str) -> str:
    """The answer a completion ends with: what follows its last "####" (GSM8K's mark), else the
    inside of its last \\boxed{...}, else its last number, else its last line; spaces, a final
    period and the commas inside a number dropped."""
    if "####" in text:
        found = text.rsplit("####", 1)[1]
    elif "\\boxed{" in text:
        found = text.rsplit("\\boxed{", 1)[1].split("}", 1)[0]
    else:
        numbers = NUMBER.findall(text)
        found = numbers[-1] if numbers else (text.strip().splitlines() or [""])[-1]
    found = found.strip().rstrip(".").strip()
    return found.replace(",", "") if NUMBER.fullmatch(found) else found


class ExactMatch:
    """1.0 where the completion's final answer (final_answer) equals the row's `field`, else 0.0."""

    name = "exact_match"

    def __init__(self, field: str = "answer"):
        """field: the prompt file's field holding each prompt's right answer."""
        self.field = field
        self.reads = (field,)

    def __call__(self, completions: Sequence, **fields) -> list[float]:
        answers = fields[self.field]
        return [float(final_answer(_text(c)) == final_answer(str(a))) for c, a in zip(completions, answers)]


class Format:
    """1.0 where the whole completion (spaces around it dropped) matches `pattern`, else 0.0."""

    name = "format"
    reads: tuple[str, ...] = ()

    def __init__(self, pattern: str = r"(?s).*####\s*\S+"):
        """pattern: a Python regular expression the completion must match whole (re.fullmatch)."""
        try:
            self.pattern = re.compile(pattern)
        except re.error as err:
            raise ConfigError(f"task.rewards: format's pattern {pattern!r} is not a regular expression ({err}).") \
                from None

    def __call__(self, completions: Sequence, **_) -> list[float]:
        return [float(self.pattern.fullmatch(_text(c).strip()) is not None) for c in completions]


class Length:
    """-|len(completion) - target| / target: 0 at `target` characters, lower either side."""

    name = "length"
    reads: tuple[str, ...] = ()

    def __init__(self, target: int = 64):
        """target: the completion length (characters) rewarded most."""
        if target < 1:
            raise ConfigError(f"task.rewards: length's target={target}: must be at least 1 character.")
        self.target = target

    def __call__(self, completions: Sequence, **_) -> list[float]:
        return [-abs(len(_text(c)) - self.target) / self.target for c in completions]


BUILT_IN: dict[str, Callable[[], Callable]] = {"exact_match": ExactMatch, "format": Format, "length": Length}


def _text(completion) -> str:
    """A completion's text: a string, or chat messages' last content."""
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def reward_name(function) -> str:
    """What the metrics call a reward function (rewards/<name>/mean): its `name`, a function's own
    name (through functools.partial), or its class's."""
    inner = getattr(function, "func", function)
    return str(getattr(function, "name", None) or getattr(inner, "__name__", None) or type(function).__name__)


def fields_read(function) -> tuple[str, ...]:
    """The prompt file's fields a function reads: its `reads`, else the keyword parameters its
    signature names besides the given ones (a **kwargs reads what it finds)."""
    declared = getattr(function, "reads", None)
    if declared is not None:
        return tuple(declared)
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return ()
    bound = getattr(function, "keywords", None) or {}  # a partial's settings are not fields
    return tuple(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                 and p.name not in GIVEN and p.name not in bound and p.default is inspect.Parameter.empty)


def resolved(entries: Sequence) -> list[Callable]:
    """task.rewards' entries as callables: a built-in's name, or what its `_target_` built."""
    functions = []
    for entry in entries:
        if isinstance(entry, str):
            if entry not in BUILT_IN:
                raise ConfigError(f"task.rewards: no built-in reward {entry!r}; choose {', '.join(BUILT_IN)}, or give "
                                  "your own as {_target_: your.module.function, _partial_: true}.")
            functions.append(BUILT_IN[entry]())
        elif callable(entry):
            functions.append(entry)
        else:
            raise ConfigError(f"task.rewards: {entry!r} is neither a built-in reward's name ({', '.join(BUILT_IN)}) nor "
                              "a function ({_target_: your.module.function, _partial_: true}).")
    names = [reward_name(f) for f in functions]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"task.rewards: {', '.join(twice)} listed twice; each reward function once (weigh one "
                          "more with task.reward_weights).")
    return functions


class RewardFailed(ConfigError):
    """A reward function raised, or returned the wrong number of values, during the run."""


def scored(function, rows: list[dict], prompts: list, completions: list[str],
           completion_ids: list[list[int]]) -> list[float]:
    """One reward function's values for the completions (NaN where it said None); `rows`: each
    completion's prompt row. Its failure names the function and the row."""
    name = reward_name(function)
    columns = {key: [row.get(key) for row in rows] for key in rows[0] if key != PLACE} if rows else {}
    try:
        values = function(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
    except Exception as err:
        row = _failing_row(function, rows, prompts, completions, completion_ids)
        raise RewardFailed(f"task.rewards: the reward function {name} raised {type(err).__name__}: {err} "
                           f"{row}. Fix the function (or the row), then resume the run from its last "
                           "checkpoint.") from err
    values = list(values) if values is not None else []
    if len(values) != len(completions):
        raise RewardFailed(f"task.rewards: the reward function {name} returned {len(values)} values for "
                           f"{len(completions)} completions; it must return one per completion (None: no opinion).")
    try:
        return [float("nan") if v is None else float(v) for v in values]
    except (TypeError, ValueError):
        raise RewardFailed(f"task.rewards: the reward function {name} returned {values[:4]!r}...: each value must be "
                           "a number or None.") from None


def _failing_row(function, rows, prompts, completions, completion_ids) -> str:
    """Which prompt's row makes `function` raise (each tried alone), as the message says it."""
    for i, row in enumerate(rows):
        try:
            function(prompts=prompts[i:i + 1], completions=completions[i:i + 1],
                     completion_ids=completion_ids[i:i + 1], **{k: [v] for k, v in row.items() if k != PLACE})
        except Exception:
            place = row.get(PLACE)
            return f"on the prompt of {place}" if place else f"on the prompt {str(prompts[i])[:80]!r}"
    return "on the batch (no row alone makes it raise)"
