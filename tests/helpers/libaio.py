"""libaio for DeepSpeed's NVMe offload in the tests: installed when the machine allows it (root,
apt-get), as the MPI and SLURM tests install theirs. `ensure_libaio()` returns None when the
library is there, else the reason it cannot be (the tests then skip, showing it)."""
from __future__ import annotations

import ctypes.util
import os
import shutil
import subprocess


def ensure_libaio() -> str | None:
    if ctypes.util.find_library("aio"):
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "libaio is not installed and this machine cannot install it (needs root and apt-get)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "install", "-y", "-q", "libaio-dev"], ["apt-get", "update", "-q"],
                    ["apt-get", "install", "-y", "-q", "libaio-dev"]):
        result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
        if command[1] == "install" and result.returncode == 0:
            break
    if not ctypes.util.find_library("aio"):
        return f"apt-get install libaio-dev failed: {result.stderr.strip().splitlines()[-1:]}"
    return None
