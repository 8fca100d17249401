"""What a data module's batches are, and which tasks take them: the contract checked before
launch, so a task given batches it cannot read is refused naming the data options that fit
(instead of an AttributeError inside the first step, or a loss computed on the wrong rows: a
preference loss on chat rows would take the first half of a batch as the chosen responses).

A data module states `batch_kind` (one of KINDS), a task `takes_batches` (the kinds it reads);
either left None (a user's own class that says nothing) leaves the verdict to the meta-device step
of framework/tasks/fit_check.py."""
from __future__ import annotations

import importlib

import yaml

from framework.errors import ConfigError
from framework.paths import conf_dir

KINDS = {
    "token_blocks": "(inputs, targets) blocks of token ids, the targets shifted by one",
    "tokens": "rows of input_ids with their labels (-100 where a token is not scored)",
    "pairs": "preference pairs: the chosen rows, then the rejected rows of the same prompts",
    "features": "(features, labels): a float vector and a class per sample",
    "points": "(points,): unlabelled float vectors (a distribution to learn)",
    "prompts": "prompts (token ids) with their rows' fields, to generate completions from",
}


def data_options_giving(kinds: tuple[str, ...]) -> list[str]:
    """The shipped data options (conf/data/*.yaml) whose batches are one of `kinds`."""
    found = []
    for path in sorted((conf_dir() / "data").glob("*.yaml")):
        target = str((yaml.safe_load(path.read_text()) or {}).get("_target_", ""))
        module, _, name = target.rpartition(".")
        try:
            kind = getattr(importlib.import_module(module), name).batch_kind
        except (ImportError, AttributeError, ValueError):
            continue
        if kind in kinds:
            found.append(f"data={path.stem}")
    return found


def check_batches(task, data, task_key: str = "task", data_key: str = "data") -> None:
    """Refuse `data` whose declared batch kind `task` does not take, naming the options that fit."""
    takes, kind = getattr(task, "takes_batches", None), getattr(data, "batch_kind", None)
    if takes is None or kind is None or kind in takes:
        return
    fitting = data_options_giving(tuple(takes))
    wanted = " or ".join(KINDS.get(k, k) for k in takes)
    raise ConfigError(
        f"{data_key} ({type(data).__name__}) gives {KINDS.get(kind, kind)}, but {task_key} ({type(task).__name__}) "
        f"reads {wanted}. Choose {' or '.join(fitting) if fitting else 'a data module giving them'}, or another task.")
