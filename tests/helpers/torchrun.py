"""Processes started by a real torchrun (`python -m torch.distributed.run`) from the tests: several
"nodes" on this machine meet through a c10d rendezvous on 127.0.0.1."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

from tests.conftest import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(node_args: list[str], train_args: list[str], cwd) -> subprocess.Popen:
    # One thread per process, as the framework's own launcher gives 2 processes on 2 cores.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *node_args, str(ROOT / "train.py"),
                             *train_args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
