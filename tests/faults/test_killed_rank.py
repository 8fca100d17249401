"""Which rank a failed group reports first when one worker vanished (SIGKILL, the out-of-memory
killer) and its peers then failed in a collective: the vanished one, whether or not the elastic
agent saw its exit code before it stopped the group (a loaded machine decides which it sees)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from framework.launch.elastic import PF_EXITING, WorkerFailed, dead_ranks, process_state, stopped_ranks

PEER_LOST = "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41000"


def test_a_peer_that_has_ended_is_dead_and_a_running_one_is_not(tmp_path):
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    try:
        (tmp_path / "pid0").write_text("1")  # this rank: never its own peer
        (tmp_path / "pid1").write_text(str(running.pid))
        (tmp_path / "pid2").write_text(str(ended.pid))
        assert dead_ranks(tmp_path, me=0) == [2]
        running.send_signal(signal.SIGSTOP)
        for _ in range(100):  # the signal is delivered asynchronously
            if stopped_ranks(tmp_path, me=0):
                break
            time.sleep(0.02)
        assert stopped_ranks(tmp_path, me=0) == [1]
        assert dead_ranks(tmp_path, me=0) == [2]  # stopped is not dead
    finally:
        running.kill()
        running.wait()


def test_a_process_that_has_begun_to_exit_counts_as_dead_before_it_is_a_zombie():
    """A SIGKILLed rank's sockets close (its peer's collective fails) before it turns zombie: the
    peer, looking at that moment, must already see it dead, or the report blames the peer."""
    me = Path("/proc/self/stat").read_text()
    assert process_state(me) == "R"
    head, rest = me.rsplit(")", 1)
    fields = rest.split()
    fields[6] = str(int(fields[6]) | PF_EXITING)
    exiting = f"{head}) {' '.join(fields)}"
    assert process_state(exiting) == "X"
    fields[0] = "Z"
    assert process_state(f"{head}) {' '.join(fields)}") == "Z"
    # a command name with spaces and parentheses does not shift the fields
    odd = me.replace(me[me.index("("):me.rindex(")") + 1], "(a b) c)", 1)
    assert process_state(odd) == "R"


def failed_group(tmp_path, agent_saw: dict[int, int], dead_at_failure: list[int], oom_kills: int = 0) -> str:
    for rank in (0, 1):
        (tmp_path / f"pid{rank}").write_text(str(1000 + rank))
    record = {"rank": 0, "attempt": 0, "time_ns": 1, "error": PEER_LOST, "traceback": "Traceback ...",
              "timed_out": False, "where": "", "stopped": [], "dead": dead_at_failure}
    (tmp_path / "rank0-attempt0.json").write_text(json.dumps(record))
    err = SimpleNamespace(failures={rank: SimpleNamespace(exitcode=code) for rank, code in agent_saw.items()})
    return str(WorkerFailed(err, tmp_path, oom_kills=oom_kills))


def test_a_vanished_rank_is_shown_first_even_when_the_agent_missed_its_exit(tmp_path):
    message = failed_group(tmp_path, agent_saw={0: 1}, dead_at_failure=[1])
    assert message.startswith("worker rank 1 died abruptly (no Python error recorded, gone before the others "
                              "failed)"), message
    assert "worker rank 0 failed after it: RuntimeError" in message
    assert "Traceback" not in message  # the consequence is named, not shown in full


def test_when_the_agent_saw_the_exit_code_it_is_named(tmp_path):
    message = failed_group(tmp_path, agent_saw={0: 1, 1: -signal.SIGKILL}, dead_at_failure=[1])
    assert message.startswith(f"worker rank 1 died abruptly (exit code {-signal.SIGKILL})"), message


def test_a_vanished_rank_while_the_cgroup_counted_oom_kills_is_out_of_memory(tmp_path):
    message = failed_group(tmp_path, agent_saw={0: 1}, dead_at_failure=[1], oom_kills=1)
    assert message.startswith("worker rank 1 was killed: out of memory"), message


def test_a_rank_alive_when_its_peer_failed_is_not_blamed(tmp_path):
    # rank 0 failed on its own while rank 1 was still running; the agent then stopped rank 1
    message = failed_group(tmp_path, agent_saw={0: 1}, dead_at_failure=[])
    assert message.startswith("worker rank 0 failed first: RuntimeError"), message
    assert message.rstrip().endswith("worker rank 1 died abruptly (no Python error recorded): killed by a signal, "
                                     "the out-of-memory killer, or a crash in native code")


def test_a_record_cut_short_by_the_agents_sigterm_does_not_hide_the_failure(tmp_path):
    """Rank 1 was stopped while writing its record (an empty file): the report still names rank 0's
    failure, and rank 1 as one that left no record."""
    (tmp_path / "rank1-attempt0.json").write_text("")
    message = failed_group(tmp_path, agent_saw={0: 1}, dead_at_failure=[])
    assert message.startswith("worker rank 0 failed first: RuntimeError"), message
    assert "worker rank 1 died abruptly (no Python error recorded)" in message
