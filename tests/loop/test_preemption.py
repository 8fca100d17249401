"""A preemption signal: save at the next step boundary, exit 75, resume=auto continues exactly."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from framework.launch.elastic import LAUNCH_FIELDS
from tests.conftest import ROOT, TINY_GPT, assert_state_equal, checkpoints, load_model_state
from tests.helpers.in_process import run_command

ARGS = [*TINY_GPT, "trainer.log_every=1", "trainer.val_every=1000", "trainer.val_at_start=false",
        "scheduler.total_steps=400", "model.dropout=0.1", "callbacks.checkpoint.every_n_steps=1000"]


def start_then_signal(tmp_path, args, sig, after_step=5):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith(f"step {after_step}/"):
            proc.send_signal(sig)
            break
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_single_process_signal_saves_and_resumes_exactly(tmp_path, sig):
    code, out, err = start_then_signal(tmp_path, [*ARGS, "name=pre", "trainer.max_steps=400"], sig)
    assert code == 75, err
    assert f"stopped by {sig.name}" in err
    (ckpt,) = checkpoints(tmp_path / "outputs" / "pre")
    stopped = int(ckpt.name.split("_")[1])
    assert stopped >= 5
    end = stopped + 3
    # the resume and the undisturbed run through the command's own entry in this process
    assert run_command(["train", *ARGS, "name=pre", f"trainer.max_steps={end}", "resume=auto"], tmp_path).returncode == 0
    assert run_command(["train", *ARGS, "name=straight", f"trainer.max_steps={end}"], tmp_path).returncode == 0
    assert_state_equal(load_model_state(checkpoints(tmp_path / "outputs" / "pre")[-1]),
                       load_model_state(checkpoints(tmp_path / "outputs" / "straight")[-1]))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_multi_process_signal_to_the_launcher(tmp_path, sig):
    """SIGTERM reaches the workers through torch's elastic agent, SIGUSR1 through our forwarder;
    both ranks stop at the same step with one checkpoint."""
    args = [*ARGS, "name=ddp", "strategy=ddp", "devices=2", "trainer.max_steps=400"]
    code, out, err = start_then_signal(tmp_path, args, sig)
    assert code == 75, err
    (ckpt,) = checkpoints(tmp_path / "outputs" / "ddp")
    # the workers returned where they stopped (torch's agent did not stop them itself); a torch
    # without LaunchConfig.signals_to_handle keeps SIGTERM for its agent
    if sig == signal.SIGUSR1 or "signals_to_handle" in LAUNCH_FIELDS:
        assert f"stopped by {sig.name} after saving a checkpoint at step {int(ckpt.name.split('_')[1])}" in err
    assert sorted(p.name for p in ckpt.iterdir()) == ["loop_rank0.pt", "loop_rank1.pt", "meta.json", "model.pt",
                                                      "optimizer.pt"]
    resumed = run_command(["train", *args[:-1], "trainer.max_steps=" + str(int(ckpt.name.split("_")[1]) + 2),
                           "resume=auto"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr


def test_the_launcher_passes_a_preemption_signal_on_and_a_second_one_stops_at_once(tmp_path, monkeypatch):
    """The first SIGTERM goes to every worker (they save and return; torch's agent, which would
    join them for 30 s and SIGKILL them, is left the signals the run does not watch); a second
    one, or one before any worker started, stops the workers as the agent does."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from framework.launch import signal_forwarder
    from framework.launch.signal_forwarder import SignalForwarder

    assert SignalForwarder.left_to_agent(["SIGTERM", "USR1"]) == "SIGINT,SIGHUP,SIGQUIT"
    assert SignalForwarder.left_to_agent([]) == "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    passed_on: list[tuple[int, int]] = []
    monkeypatch.setattr(signal_forwarder.os, "kill", lambda pid, sig: passed_on.append((pid, sig)))
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    forwarder = SignalForwarder(["SIGTERM", "SIGUSR1"], tmp_path)
    try:
        with pytest.raises(SignalException):  # no worker has started yet
            signal.raise_signal(signal.SIGTERM)
        (tmp_path / "pid0").write_text("4242")
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR1):  # SIGUSR1 every time: no signal of the agent's
            signal.raise_signal(sig)
        assert passed_on == [(4242, signal.SIGTERM), (4242, signal.SIGUSR1), (4242, signal.SIGUSR1)]
        with pytest.raises(SignalException) as second:
            signal.raise_signal(signal.SIGTERM)
        assert second.value.sigval == signal.SIGTERM and len(passed_on) == 3
    finally:
        forwarder.restore()
    assert {s: signal.getsignal(s) for s in previous} == previous
