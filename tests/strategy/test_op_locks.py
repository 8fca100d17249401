"""A DeepSpeed op build stopped mid-way (SIGKILL while it holds torch's extension lock) never
leaves the next run waiting in silence: the next builder takes the lock over, and a process that
was waiting for the dead builder stops with the cause (framework/strategy/deepspeed/op_locks.py).
torch's own FileBaton is what DeepSpeed's op builder locks with, used here as it uses it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from torch.utils.file_baton import FileBaton

from framework.strategy.deepspeed import op_locks
from framework.strategy.deepspeed.imports import deepspeed_package

BUILDER = textwrap.dedent("""
    import sys, time
    from torch.utils.file_baton import FileBaton
    from framework.strategy.deepspeed.op_locks import watch_op_builds
    watch_op_builds()
    baton = FileBaton(sys.argv[1])
    assert baton.try_acquire()
    print("building", flush=True)
    time.sleep(600)  # killed mid-build
""")


@pytest.fixture(autouse=True)
def watched():
    """The watch as a run gets it: through the one path every DeepSpeed strategy imports DeepSpeed by
    (not installed by hand here, so a path that lost it fails these tests)."""
    deepspeed_package()


def test_importing_deepspeed_the_frameworks_way_installs_the_watch():
    assert FileBaton.try_acquire.__module__ == op_locks.__name__
    assert FileBaton.release.__module__ == op_locks.__name__


def _killed_builder(lock) -> int:
    """A process that takes the op's lock as a framework builder does, then dies by SIGKILL."""
    builder = subprocess.Popen([sys.executable, "-c", BUILDER, str(lock)], stdout=subprocess.PIPE, text=True)
    assert builder.stdout.readline().strip() == "building"
    builder.send_signal(signal.SIGKILL)
    builder.wait(timeout=30)
    return builder.pid


@pytest.mark.slow  # a fresh interpreter or a pool of processes (make test-fast starts none)
def test_a_lock_left_by_a_killed_build_is_taken_over_by_the_next(tmp_path, capfd):
    lock = tmp_path / "async_io" / "lock"
    lock.parent.mkdir()
    pid = _killed_builder(lock)
    assert lock.exists()  # what torch alone would wait on forever
    baton = FileBaton(str(lock))
    assert baton.try_acquire()  # taken over: this process builds
    assert f"(pid {pid}) stopped before it finished" in capfd.readouterr().err
    second = FileBaton(str(lock))
    assert not second.try_acquire()  # a live builder's lock is respected
    baton.release()
    assert not lock.exists()
    assert FileBaton(str(lock)).try_acquire()


@pytest.mark.slow  # a fresh interpreter or a pool of processes (make test-fast starts none)
def test_a_wait_for_a_builder_that_dies_stops_with_the_cause(tmp_path):
    lock = tmp_path / "cpu_adam" / "lock"
    lock.parent.mkdir()
    builder = subprocess.Popen([sys.executable, "-c", BUILDER, str(lock)], stdout=subprocess.PIPE, text=True)
    assert builder.stdout.readline().strip() == "building"
    waiter = FileBaton(str(lock), wait_seconds=0.05)
    assert not waiter.try_acquire()
    threading.Timer(0.5, builder.send_signal, (signal.SIGKILL,)).start()
    started = time.monotonic()
    with pytest.raises(op_locks.OpBuildStopped, match=f"pid {builder.pid}.*Run again"):
        waiter.wait()
    builder.wait(timeout=30)
    assert time.monotonic() - started < 30 and not lock.exists()


def test_a_wait_for_a_lock_of_unknown_origin_says_what_it_waits_for(tmp_path, monkeypatch, capfd):
    lock = tmp_path / "fused_adam" / "lock"
    lock.parent.mkdir()
    lock.touch()  # made by something that is not a framework builder (a plain torch build)
    monkeypatch.setattr(op_locks, "SAY_EVERY_S", 0.2)
    assert not FileBaton(str(lock)).try_acquire()  # not known to be dead: not taken
    threading.Timer(0.7, os.remove, (lock,)).start()
    FileBaton(str(lock), wait_seconds=0.05).wait()
    said = capfd.readouterr().err
    assert "waiting" in said and f"remove {lock} and run again" in said


@pytest.mark.parametrize("variable", ["TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME"])
def test_an_unwritable_extensions_folder_is_refused_before_launch(tmp_path, variable):
    """DeepSpeed compiles its ops into TORCH_EXTENSIONS_DIR (else $XDG_CACHE_HOME/torch_extensions):
    a folder that cannot be created stops the run before launch, naming the variable and the fix,
    instead of failing the first op build mid-run."""
    from tests.conftest import TINY_GPT
    from tests.helpers.in_process import run_command

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    env = {"TORCH_EXTENSIONS_DIR": str(blocker / "ext")} if variable == "TORCH_EXTENSIONS_DIR" else \
        {"XDG_CACHE_HOME": str(blocker / "cache")}
    saved = os.environ.pop("TORCH_EXTENSIONS_DIR", None)
    try:
        result = run_command(["train", "strategy=deepspeed_stage_1", "devices=2", *TINY_GPT], tmp_path, env=env)
    finally:
        if saved is not None:
            os.environ["TORCH_EXTENSIONS_DIR"] = saved
    shown = str(blocker / "ext") if variable == "TORCH_EXTENSIONS_DIR" else str(blocker / "cache" / "torch_extensions")
    assert result.returncode == 2, result.stderr[-2000:]
    assert (f"TORCH_EXTENSIONS_DIR={shown}: cannot be created, because {blocker} is a file, not a folder; set "
            "TORCH_EXTENSIONS_DIR to a folder you can write") in result.stderr
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("checkpoints"))


def test_a_wait_starting_before_the_builder_made_its_lock_waits_for_the_build(tmp_path):
    """The builder takes its owner flock before torch's lock file exists: a process whose try_acquire
    lost in that window used to see no lock, stop waiting at once and load an op not built yet (CI:
    deepspeed_shm_comm.so "cannot open shared object file", two ranks' first build on a fresh machine)."""
    import fcntl
    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir()
    built = lock.parent / "deepspeed_shm_comm.so"
    owner = os.open(str(lock) + op_locks.OWNER_SUFFIX, os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.flock(owner, fcntl.LOCK_EX)  # a builder between its flock and its lock (another open file: they conflict)
    assert not FileBaton(str(lock)).try_acquire()
    assert not lock.exists()

    def build():
        lock.touch()
        time.sleep(0.3)
        built.touch()
        os.remove(lock)
        fcntl.flock(owner, fcntl.LOCK_UN)
        os.close(owner)

    threading.Timer(0.3, build).start()
    FileBaton(str(lock), wait_seconds=0.02).wait()
    assert built.exists()
