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

REPOSITORY = Path(__file__).resolve().parents[2]


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str


def run_command(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> Outcome:
    """`argv` after the program: ["train", ...] is `python train.py ...` (framework train is the same
    app), anything else a `framework` subcommand. Run from `cwd`, with HYDRA_FULL_ERROR unset as a
    user's shell has it and `env` added (its PYTHONPATH onto the import path, as an interpreter
    starting with it would put it); stdout and stderr captured, the exit code as the shell would
    see it."""
    out, err = io.StringIO(), io.StringIO()
    # what a command may change for the processes it starts (the trust list it was given goes into
    # the environment, a recipe's folder onto the import path, the user's modules it imported) ends
    # with it, as its process would
    saved_argv, saved_path, saved_cwd, saved_env = sys.argv[:], sys.path[:], os.getcwd(), dict(os.environ)
    saved_modules = set(sys.modules)
    os.environ.pop("HYDRA_FULL_ERROR", None)
    os.environ.update(env or {})
    if env and env.get("PYTHONPATH"):
        sys.path[:0] = env["PYTHONPATH"].split(os.pathsep)
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
        forget_user_modules(saved_modules)
    return Outcome(int(code), out.getvalue(), err.getvalue())


def forget_user_modules(before: set[str]) -> None:
    """Drop the modules imported since `before` from outside the installed packages and this
    repository (a user's module beside a recipe, a package on the PYTHONPATH it was given): the
    next command may find another module under the same name, in its own folder."""
    kept = (sys.prefix, sys.base_prefix, str(REPOSITORY))
    for name in set(sys.modules) - before:
        module = sys.modules.get(name)
        where = getattr(module, "__file__", None) or next(iter(getattr(module, "__path__", None) or []), None)
        if where is not None and not str(where).startswith(kept):
            del sys.modules[name]
