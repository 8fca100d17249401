"""Trained runs shared by the whole test session: a run is trained once per distinct list of
overrides, whichever test (on whichever pytest-xdist worker) asks first, and every later test
reads the same run directory. Runs are deterministic on one machine at one thread count (the
suite's resume tests check exactly that), so a reference trained for one test serves all.

The cache lives in the folder FRAMEWORK_TEST_RUNS names (tests/conftest.py makes one per session,
before the workers start, and removes it at the end); a lock file per run makes the second worker
wait while the first trains. A cached run is read-only for its users: a test that writes (a resume
into the same folder) trains its own."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import run_inprocess

ENV = "FRAMEWORK_TEST_RUNS"


def cache_root() -> Path:
    return Path(os.environ[ENV])


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def key_of(overrides: list[str]) -> str:
    return hashlib.sha256(json.dumps(list(overrides)).encode()).hexdigest()[:20]


def trained_run(overrides: list[str]) -> Path:
    """The run directory of `framework.run` on `overrides` (composed as tests/conftest.py's
    compose_cfg does), trained on first use. A run that raised is not cached: the next caller
    trains it again and sees the same error."""
    key = key_of(overrides)
    folder = cache_root() / key
    with _locked(cache_root() / f"{key}.lock"):
        if not (folder / "done").exists():
            shutil.rmtree(folder, ignore_errors=True)
            run_inprocess(list(overrides), folder / "run")
            (folder / "overrides.json").write_text(json.dumps(list(overrides), indent=1))
            (folder / "done").write_text("")
    return folder / "run"
