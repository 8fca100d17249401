"""Run the `framework` command as a user does. The commands that only read and print (plan,
validate, list, cp) run in this process through the command's own entry (tests/helpers/in_process.py:
the same parser, the same exit codes, no interpreter start-up), with the environment a call gives
them; the rest in a fresh interpreter from the given working directory, unless a test asks for
this process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.in_process import run_command

IN_PROCESS = ("plan", "validate", "list", "cp")


def framework_cmd(*args, cwd=None, env=None, timeout=600, in_process: bool | None = None):
    """`in_process`: True runs any command in this process (a run whose printed output is its
    launching process's: single-process, or refused before launch; a multi-process run's workers
    print to the processes they were forked from); False a fresh interpreter whatever the command
    (what a process reads once, e.g. the installed packages' entry points); None: IN_PROCESS's."""
    if args and (in_process if in_process is not None else args[0] in IN_PROCESS):
        return run_command(list(args), Path(cwd) if cwd else Path.cwd(), env)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "framework", *args], capture_output=True, text=True, cwd=cwd,
                          env=full_env, timeout=timeout)
