"""User-facing errors: one clear paragraph, exit code 2, no traceback unless asked for."""
from __future__ import annotations

import os
import sys
from difflib import get_close_matches
from enum import IntEnum


class ExitCode(IntEnum):
    """Every exit code the framework decides (documented in docs/errors.md)."""

    OK = 0
    FAILED = 1  # a worker crashed or a framework bug: the report shows the traceback
    USER_ERROR = 2  # a bad config, file or combination: one paragraph, nothing written
    DIVERGED = 3  # the loss or gradients became NaN/inf (trainer.on_nonfinite=stop): stopped, finite checkpoints kept
    STORAGE = 74  # EX_IOERR: storage failed while saving (disk full); earlier checkpoints kept; resume=auto continues
    PREEMPTED = 75  # EX_TEMPFAIL: stopped by a signal after saving; resume=auto continues


class RunExit(SystemExit):
    """An exit the framework decided (its code is an ExitCode), as opposed to Hydra's own."""


class UserError(Exception):
    """A mistake in what the user gave us (config, file, combination). Never a framework bug."""


class ConfigError(UserError):
    """A bad key, value, type or combination in the configuration."""


def indivisible(given: str, size: int, count: int, what: str, fix: str) -> list[str]:
    """The one form of a layout's divisibility rule: `[given does not divide what; fix]` where `size`
    (given as `given`, its key=value) does not divide `count` (said as `what`), else [] (a size below
    1 divides nothing). The ranks' rules are in framework/strategy/mesh/dims.py; those that need the
    model or the batch where the applier that has them checks them."""
    return [] if size >= 1 and count % size == 0 else [f"{given} does not divide {what}; {fix}"]


def refuse(problems: list[str]) -> None:
    """ConfigError with the first of `problems`, if any."""
    if problems:
        raise ConfigError(problems[0])


class CheckpointError(UserError):
    """A checkpoint that is missing, incomplete, corrupt or unsafe to load."""


class StorageError(CheckpointError):
    """Storage failed under a running job (the disk filled up while a checkpoint was written):
    the partial checkpoint is removed, the complete ones are kept, resume=auto continues."""


def did_you_mean(word: str, choices, cutoff: float = 0.5) -> str:
    """' Did you mean X?' for the closest of `choices`, or '' (for every unknown-name message)."""
    close = get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return f" Did you mean {close[0]}?" if close else ""


def wants_traceback(debug: bool = False) -> bool:
    return bool(debug) or os.environ.get("HYDRA_FULL_ERROR") == "1"


def heading(err: BaseException) -> str:
    """The kind of error as the user reads it: 'configuration error', 'checkpoint error', 'error'."""
    return {ConfigError: "configuration error", CheckpointError: "checkpoint error",
            StorageError: "storage error"}.get(type(err), "error")


def report(err: BaseException, stream=None) -> None:
    """Print `err` as one wrapped paragraph, prefixed with its kind."""
    stream = stream or sys.stderr
    body = str(err)
    if "\n" in body:  # several problems: one per line, indented under the heading
        body = "\n" + "\n".join(f"  - {line}" for line in body.splitlines())
    print(f"{heading(err)}: {body}\n(set debug=true or HYDRA_FULL_ERROR=1 for a traceback)", file=stream)
