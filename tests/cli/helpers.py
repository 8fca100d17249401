"""Run the `framework` command as a user does. The commands that only read and print (plan,
validate, list, cp) run in this process through the command's own entry (tests/helpers/in_process.py:
the same parser, the same exit codes, no interpreter start-up); the rest, and any call that needs
an environment of its own, in a fresh interpreter from the given working directory."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.in_process import run_command

IN_PROCESS = ("plan", "validate", "list", "cp")


def framework_cmd(*args, cwd=None, env=None, timeout=600):
    if args and args[0] in IN_PROCESS and env is None:
        return run_command(list(args), Path(cwd) if cwd else Path.cwd())
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "framework", *args], capture_output=True, text=True, cwd=cwd,
                          env=full_env, timeout=timeout)
