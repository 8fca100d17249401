"""A command as a user types it (`python train.py ARGS`, `framework COMMAND ARGS`), run in this
process: the same entry (the guard, Hydra's app, the `framework` command's parser) without an
interpreter's start-up, for checks that end before a run starts (refusals, plans)."""
from __future__ import annotations

import contextlib
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from framework.cli import main as framework_main


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str


def run_command(argv: list[str], cwd: Path) -> Outcome:
    """`argv` after the program: ["train", ...] is `python train.py ...` (framework train is the same
    app), anything else a `framework` subcommand. Run from `cwd`, with HYDRA_FULL_ERROR unset as a
    user's shell has it; stdout and stderr captured, the exit code as the shell would see it."""
    out, err = io.StringIO(), io.StringIO()
    # what a command may change for the processes it starts (the trust list it was given goes into
    # the environment, a recipe's folder onto the import path) ends with it, as its process would
    saved_argv, saved_path, saved_cwd, saved_env = sys.argv[:], sys.path[:], os.getcwd(), dict(os.environ)
    os.environ.pop("HYDRA_FULL_ERROR", None)
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = framework_main(list(argv))
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        os.chdir(saved_cwd)
        sys.argv[:], sys.path[:] = saved_argv, saved_path
        os.environ.clear()
        os.environ.update(saved_env)
    return Outcome(int(code), out.getvalue(), err.getvalue())
