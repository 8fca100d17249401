"""The command that starts every replica group (framework/launch/replica_groups.py `supervise`): a
group that dies is restarted with resume=auto until fault_tolerance.restarts runs out; a group that
stops for a reason a restart would meet again (2, 3, 74, 75) stops every group with its code; a
SIGTERM to the command is passed on to the groups. The groups are stand-in processes that exit as
each test scripts them (the lighthouse is torchft's own); the real thing: test_torchft.py."""
from __future__ import annotations

import io
import os
import signal
import subprocess
from pathlib import Path

import pytest

from framework.errors import ExitCode, RunExit, UserError
from framework.fault_tolerance.torchft import TorchFT
from framework.launch import replica_groups
from framework.launch.replica_groups import supervise

pytest.importorskip("torchft")

RUNNING = None  # what poll() says of a process still running


class Stuck:
    """A group whose workers hang: it lets `ignored` SIGTERMs pass, then stops on the next signal."""

    def __init__(self, ignored: int):
        self.ignored = ignored


class Scripted:
    """Stand-in processes: the n-th start of group g exits as `script[g][n]` says, one poll() later
    (RUNNING: runs until it is sent a signal, then exits with minus that signal)."""

    def __init__(self, script: dict[int, list], on_poll=None):
        self.script, self.on_poll = script, on_poll
        self.started: list[tuple[int, list[str]]] = []
        self.signalled: list[tuple[int, int]] = []

    def popen(self, command, env, **_):
        group = int(next(a for a in command if a.startswith("fault_tolerance.replica_id=")).split("=")[1])
        starts = sum(1 for g, _ in self.started if g == group)
        self.started.append((group, command))
        return _Process(self, group, self.script[group][starts])


class _Process:
    def __init__(self, scripted: Scripted, group: int, exit_code):
        self.scripted, self.group, self.exit_code = scripted, group, exit_code
        self.stdout = io.StringIO("")
        self.polls = 0

    def poll(self):
        self.polls += 1
        if self.polls > 1000:  # a supervisor that should have stopped the groups long ago
            raise AssertionError(f"group {self.group} still polled after 1000 rounds: the command never stopped")
        if self.scripted.on_poll:
            self.scripted.on_poll(self)
        return self.exit_code if self.polls > 1 and not isinstance(self.exit_code, Stuck) else None

    def send_signal(self, signum):
        self.scripted.signalled.append((self.group, signum))
        if isinstance(self.exit_code, Stuck) and signum != signal.SIGKILL and self.exit_code.ignored > 0:
            self.exit_code.ignored -= 1
        elif self.exit_code is RUNNING or isinstance(self.exit_code, Stuck):
            self.exit_code = -signum

    def wait(self, timeout=None):
        if self.exit_code is RUNNING or isinstance(self.exit_code, Stuck):
            raise subprocess.TimeoutExpired("group", timeout)
        return self.exit_code

    def kill(self):
        self.send_signal(signal.SIGKILL)


def run(script, tmp_path, monkeypatch, restarts=2, on_poll=None):
    scripted = Scripted(script, on_poll)
    monkeypatch.setattr(replica_groups.subprocess, "Popen", scripted.popen)
    monkeypatch.setattr(replica_groups.time, "sleep", lambda seconds: None)
    said: list[str] = []
    ft = TorchFT(replica_groups=len(script), port="auto", restarts=restarts)
    outcome = None
    try:
        outcome = supervise(ft, ["train.py", "devices=1"], Path(tmp_path), said.append)
    except (RunExit, UserError) as err:
        outcome = err
    return scripted, said, outcome


def test_a_dead_group_is_restarted_with_resume_auto_and_the_run_ends_well(tmp_path, monkeypatch):
    scripted, said, summary = run({0: [0], 1: [-signal.SIGKILL, 0]}, tmp_path, monkeypatch)
    assert [g for g, _ in scripted.started] == [0, 1, 1]
    first, again = [c for g, c in scripted.started if g == 1]
    assert "resume=auto" not in first and again[-1] == "resume=auto"  # the restarted group resumes, then heals
    assert f"hydra.run.dir={tmp_path / 'replica_1'}" in again
    assert "fault_tolerance: group 1 died (exit -9); the others go on without it" in said
    assert "fault_tolerance: group 1 restarted (1 of 2); it heals from a live peer" in said
    assert [g["exits"] for g in summary["replica_groups"]] == [[0], [-9, 0]]
    assert [g["starts"] for g in summary["replica_groups"]] == [1, 2]


def test_restarts_stop_at_the_cap_and_stop_every_group(tmp_path, monkeypatch):
    scripted, said, outcome = run({0: [RUNNING], 1: [1, 1, 1, 0]}, tmp_path, monkeypatch, restarts=2)
    assert isinstance(outcome, RunExit) and outcome.code == ExitCode.FAILED
    assert [g for g, _ in scripted.started].count(1) == 3  # the first start and 2 restarts, not a third
    assert any(line.startswith("fault_tolerance: group 1 died 3 times (exit 1; fault_tolerance.restarts=2)")
               for line in said), said
    assert (0, signal.SIGTERM) in scripted.signalled  # the live group is told to stop


@pytest.mark.parametrize("code", [ExitCode.DIVERGED, ExitCode.STORAGE, ExitCode.PREEMPTED])
def test_a_stop_a_restart_would_meet_again_stops_every_group_with_its_code(tmp_path, monkeypatch, code):
    scripted, said, outcome = run({0: [RUNNING], 1: [int(code)]}, tmp_path, monkeypatch)
    assert isinstance(outcome, RunExit) and outcome.code == code
    assert [g for g, _ in scripted.started] == [0, 1]  # not restarted
    assert f"fault_tolerance: group 1 stopped with exit {int(code)} (its message is above); the other groups are " \
           "stopped" in said
    assert scripted.signalled == [(0, signal.SIGTERM)]


def test_a_groups_config_error_stops_every_group_as_the_users_mistake(tmp_path, monkeypatch):
    scripted, said, outcome = run({0: [RUNNING], 1: [int(ExitCode.USER_ERROR)]}, tmp_path, monkeypatch)
    assert isinstance(outcome, UserError) and "group 1 stopped for its config (exit 2" in str(outcome)
    assert scripted.signalled == [(0, signal.SIGTERM)]


def test_a_sigterm_to_the_command_is_passed_on_to_every_group(tmp_path, monkeypatch):
    sent = []

    def preempt_once(process):
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)  # a scheduler preempting the job

    def outside(signum, frame):  # what would see the signal if the command did not take it
        reached_outside.append(signum)

    reached_outside: list[int] = []
    previous = signal.signal(signal.SIGTERM, outside)
    try:
        scripted, said, outcome = run({0: [RUNNING], 1: [RUNNING]}, tmp_path, monkeypatch, on_poll=preempt_once)
        assert signal.getsignal(signal.SIGTERM) is outside  # the handler before the command's is put back
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not reached_outside
    assert isinstance(outcome, RunExit) and outcome.code == ExitCode.PREEMPTED
    assert sorted(scripted.signalled) == [(0, signal.SIGTERM), (1, signal.SIGTERM)]  # each saves and stops


@pytest.mark.parametrize("ignored", [1, 2])
def test_a_group_that_does_not_stop_is_signalled_again_then_killed(tmp_path, monkeypatch, ignored):
    """Its workers hung: the first SIGTERM (save at the next step) cannot be acted on; the second
    makes its launcher stop its workers itself; SIGKILL is the last resort."""
    scripted, said, outcome = run({0: [Stuck(ignored)], 1: [int(ExitCode.PREEMPTED)]}, tmp_path, monkeypatch)
    assert isinstance(outcome, RunExit) and outcome.code == ExitCode.PREEMPTED
    expected = [(0, signal.SIGTERM), (0, signal.SIGTERM)] + ([(0, signal.SIGKILL)] if ignored == 2 else [])
    assert scripted.signalled == expected
