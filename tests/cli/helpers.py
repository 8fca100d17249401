"""Run the `framework` command as a user does (a fresh interpreter, any working directory)."""
from __future__ import annotations

import os
import subprocess
import sys


def framework_cmd(*args, cwd=None, env=None, timeout=600):
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "framework", *args], capture_output=True, text=True, cwd=cwd,
                          env=full_env, timeout=timeout)
