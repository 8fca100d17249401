"""Start the local worker processes with torch's elastic agent.

The resolved config travels to each worker as plain containers, together with the output
directory; nothing re-reads `sys.argv` or Hydra's state, which is what keeps Hydra multirun
working (each job gets its own worker group, rendezvous port and run directory).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from framework.config.trust import ENV_ALLOW, user_allowed
from framework.errors import UserError
from framework.launch.oom import OomWatch
from framework.launch.rendezvous_names import name_rendezvous_events_cheaply
from framework.launch.signal_forwarder import SignalForwarder
from framework.loop.preemption import Preempted
from framework.loop.state import FitResult, RunMode
from framework.results import write_json
from framework.trainer import train_worker

LAUNCH_FIELDS = {f.name for f in dataclasses.fields(LaunchConfig)}

#: the cores of this machine a run may use (set by the command that starts replica groups side by
#: side: framework/launch/replica_groups.py); unset: all of them
CORES_ENV = "FRAMEWORK_CORES"


#: the launching process's environment when it started its forkserver (the workers' environment
#: is the forkserver's, plus what changed since: `environment_changes`); None: not started here
_FORKSERVER_ENV: dict[str, str] | None = None
#: packages the forkserver imports besides framework/launch/preload.py's, named by a program that
#: launches many runs from one process (a sweep driver, a notebook, a test session): the workers of
#: every run then share one import instead of each making its own (transformers, peft, torchmetrics:
#: a second or two each). Only packages whose import starts no device: CUDA must not be initialised
#: before a fork. Read when the forkserver starts (once a process); one not installed is skipped.
EXTRA_PRELOAD: list[str] = []
#: variables a scheduler or launcher sets in each process it starts: then this process starts no workers
_STARTED_BY_A_SCHEDULER = ("LOCAL_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "JSM_NAMESPACE_RANK")


def start_forkserver() -> None:
    """Start the forkserver local workers are forked from (its imports: framework/launch/preload.py,
    ~2-3 s of torch and the framework) unless it runs already. Called as soon as a run looks
    multi-process, so those imports overlap the launching process's own preflight instead of
    following it; what the environment gains or loses after this reaches the workers through
    `environment_changes`."""
    global _FORKSERVER_ENV
    if getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None) is not None:
        return  # running (started here earlier, or by the user's own code)
    # the extra packages before preload.py, whose gc.freeze then covers their objects too
    multiprocessing.set_forkserver_preload(["__main__", *EXTRA_PRELOAD, "framework.launch.preload"])
    _FORKSERVER_ENV = dict(os.environ)
    multiprocessing.forkserver.ensure_running()


def may_start_local_workers(devices, num_nodes, strategy_target: str) -> bool:
    """Whether a run of these settings is likely to fork local workers (a guess before preflight:
    a wrong one costs a forkserver's imports in the background, nothing else)."""
    try:
        many = int(devices) * int(num_nodes) > 1
    except (TypeError, ValueError):  # devices=auto: resolved by the accelerator later
        return False
    # read from the target's name, not its class: nothing is imported before preflight's trust check
    spawned = any(word in strategy_target.lower() for word in ("spawn", "xla"))
    return many and not spawned and not any(name in os.environ for name in _STARTED_BY_A_SCHEDULER)


def environment_changes() -> tuple[dict[str, str], list[str], list[str]]:
    """(variables set or changed, variables removed, the import path) of this process now: the
    workers forked from a server started earlier inherit its older environment and import path (a
    recipe's folder, a user's package added during preflight)."""
    before = _FORKSERVER_ENV or dict(os.environ)
    changed = {key: value for key, value in os.environ.items() if before.get(key) != value}
    return changed, [key for key in before if key not in os.environ], list(sys.path)


def worker_entry(config: dict, output_dir: str, threads: int, failure_dir: str, trusted: list[str], mode: RunMode,
                 environment: tuple[dict[str, str], list[str], list[str]] | None = None):
    """Module-level (picklable) entry of every worker process. `trusted`: the prefixes the user
    allowed in the launching process; `environment`: what its environment gained and lost since
    the forkserver started, and its import path (a forkserver started earlier has older ones)."""
    if environment is not None:
        changed, removed, path = environment
        os.environ.update(changed)
        for key in removed:
            os.environ.pop(key, None)
        sys.path[:] = path
    os.environ[ENV_ALLOW] = ",".join(trusted)

    torch.set_num_threads(threads)

    (Path(failure_dir) / f"pid{os.environ.get('RANK', 0)}").write_text(str(os.getpid()))  # for SignalForwarder
    try:
        return train_worker(config, output_dir, mode)
    except UserError as err:  # returned (pickled) and re-raised by the launching process: exit code 2
        return err
    except BaseException as err:
        # When one rank fails, the others fail soon after (a collective loses its peer); the
        # launching process shows the earliest failure first, so it records when this one happened.
        rank = int(os.environ.get("RANK", 0))
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        record = {"rank": rank, "attempt": attempt, "time_ns": time.time_ns(),
                  "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc(),
                  "timed_out": is_collective_timeout(err), "where": framework_frame(err),
                  "stopped": stopped_ranks(Path(failure_dir), rank), "dead": dead_ranks(Path(failure_dir), rank)}
        # whole or not at all: the agent may SIGTERM this process mid-write once a peer failed
        write_json(Path(failure_dir) / f"rank{rank}-attempt{attempt}.json", record)
        for peer in record["stopped"]:  # let a stopped peer take the agent's SIGTERM now, not after 30 s
            _continue(Path(failure_dir), peer)
        raise


# gloo, the c10d store, and NCCL's watchdog, when a peer never arrives
TIMEOUT_TEXTS = ("Timed out waiting", "Timed out after", "Socket Timeout", "Watchdog caught collective operation timeout")


def is_collective_timeout(err: BaseException) -> bool:
    """A collective (or the store behind it) gave up waiting for a peer: strategy.timeout_s passed."""
    return isinstance(err, (RuntimeError, TimeoutError)) and any(t in str(err) for t in TIMEOUT_TEXTS)


def framework_frame(err: BaseException) -> str:
    """The innermost frame of the framework's own code where `err` was raised: what it was doing."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f"{os.sep}framework{os.sep}" in f.filename]
    named = [f"{f.name} (framework/{f.filename.split(f'{os.sep}framework{os.sep}')[-1]}:{f.lineno})"
             for f in frames[-2:]]
    return ", called from ".join(reversed(named))


PF_EXITING = 0x4  # the kernel's task flag: set when a process starts to exit, before its sockets close


def process_state(stat: str) -> str:
    """A process's state letter from its /proc/<pid>/stat line (R, S, T, Z, ...), "X" once it has
    begun to exit. A SIGKILLed process closes its sockets (its peers' collectives fail at once)
    before it turns zombie, so a peer that looked only at the letter could find it still running."""
    fields = stat.rsplit(")", 1)[1].split()  # the command name in parentheses may hold spaces
    state, flags = fields[0], int(fields[6])
    return "X" if flags & PF_EXITING and state not in ("Z", "X") else state


def _peer_states(failure_dir: Path, me: int) -> dict[int, str | None]:
    """Each other local rank's process state (process_state), None where it has none in /proc."""
    states = {}
    for pid_file in failure_dir.glob("pid*"):
        rank = int(pid_file.name[3:])
        if rank == me:
            continue
        try:
            states[rank] = process_state(Path(f"/proc/{int(pid_file.read_text())}/stat").read_text())
        except (OSError, ValueError, IndexError):
            states[rank] = None
    return states


def stopped_ranks(failure_dir: Path, me: int) -> list[int]:
    """Local ranks whose process is stopped (SIGSTOP, a debugger): state T or t in /proc."""
    return sorted(r for r, state in _peer_states(failure_dir, me).items() if state in ("T", "t"))


def dead_ranks(failure_dir: Path, me: int) -> list[int]:
    """Local ranks whose process has ended or is ending (gone from /proc, exiting, or a zombie not
    yet reaped)."""
    return sorted(r for r, state in _peer_states(failure_dir, me).items() if state in (None, "Z", "X"))


def _continue(failure_dir: Path, rank: int) -> None:
    try:
        os.kill(int((failure_dir / f"pid{rank}").read_text()), signal.SIGCONT)
    except (OSError, ValueError):
        pass


def worker_threads(nproc: int) -> int:
    """Each worker's torch threads: its share of this node's cores (or of the share that a command
    running several groups here gave this one), at most OMP_NUM_THREADS where that is set (as
    torchrun reads it: the threads a process may use)."""
    threads = max(1, int(os.environ.get(CORES_ENV) or os.cpu_count() or 1) // nproc)
    try:
        cap = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:  # unset, or not a number (OpenMP's own "4,2" nesting form): no cap
        return threads
    return max(1, min(threads, cap))


def launch_local_workers(config: dict, output_dir: Path, plugins, nproc: int, mode: RunMode = RunMode()) -> FitResult:
    """Run `nproc` workers on this node and return rank zero's result (a user error any rank
    returned is raised here, as the user's error)."""
    # Worker failures are reported once, by WorkerFailed, not again by the agent's own logging.
    for name in ("torch.distributed.elastic", "torch.multiprocessing"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    threads = worker_threads(nproc)
    if plugins.strategy.start_method == "forkserver":
        # Workers forked from a server that imported torch and the framework share those pages
        # (framework/launch/preload.py). Takes effect when the server starts: at the first launch
        # (a forkserver the user's own code started earlier keeps its own list: workers then
        # import torch themselves, correct but without the saving).
        start_forkserver()  # where it was not started before preflight: its imports overlap the rendezvous
    logs_dir = Path(tempfile.mkdtemp(prefix="elastic-", dir=output_dir))
    failure_dir = logs_dir / "failures"
    failure_dir.mkdir()
    preemption_signals = config["trainer"].get("preemption_signals", [])
    taken = ({"signals_to_handle": SignalForwarder.left_to_agent(preemption_signals)}
             if "signals_to_handle" in LAUNCH_FIELDS else {})
    launch_config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
        rdzv_backend="c10d", rdzv_endpoint=f"{plugins.cluster.main_address}:{plugins.cluster.main_port}",
        max_restarts=config["trainer"].get("max_restarts", 0), start_method=plugins.strategy.start_method,
        monitor_interval=0.1, logs_specs=DefaultLogsSpecs(log_dir=str(logs_dir)),
        local_addr=plugins.cluster.main_address, **taken,
    )
    name_rendezvous_events_cheaply()
    oom_watch = OomWatch()
    forwarder = SignalForwarder(preemption_signals, failure_dir)
    try:
        results = elastic_launch(launch_config, worker_entry)(config, str(output_dir), threads, str(failure_dir),
                                                              user_allowed(), mode, environment_changes())
    except ChildFailedError as err:
        raise WorkerFailed(err, failure_dir, oom_watch.kills(), oom_watch.limit) from None
    except SignalException as err:
        # The agent stopped the workers itself (a second preemption signal, one before any worker
        # started, or one it handles: framework/launch/signal_forwarder.py); a worker that reached
        # its next step boundary before that saved a checkpoint there.
        raise Preempted(signal.Signals(err.sigval).name, None) from None
    finally:
        forwarder.restore()
        _remove_tree(logs_dir)
    for rank in sorted(results):
        if isinstance(results[rank], UserError):
            raise results[rank]
    return results[0]


def _read_record(path: Path) -> dict | None:
    """A rank's failure record; None for one that cannot be read (a rank's own report of its failure
    must never hide the failure: that rank then counts as one that left no record)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _exit_code(code: int | None) -> str:
    return f"exit code {code}" if code is not None else "no Python error recorded, gone before the others failed"


class WorkerFailed(RuntimeError):
    """A worker process died or raised. Every Python error in a worker leaves a record, so a rank
    without one died abruptly (SIGKILL, the out-of-memory killer, a crash in native code): that is
    the likely cause and is shown first when it was gone before any other rank failed (the agent
    saw its exit code, or the first rank to fail found it gone; the agent alone misses it on a
    loaded machine). Then the Python errors, earliest first with its traceback; the later ones are
    usually consequences (a collective that lost its peer)."""

    def __init__(self, err, failure_dir: Path, oom_kills: int = 0, memory_limit: int | None = None):
        records = [record for p in failure_dir.glob("rank*.json") if (record := _read_record(p)) is not None]
        last_attempt = max((r["attempt"] for r in records), default=0)  # earlier attempts were restarted
        records = sorted((r for r in records if r["attempt"] == last_attempt), key=lambda r: r["time_ns"])
        started = {int(p.name[3:]) for p in failure_dir.glob("pid*")}
        recorded = {r["rank"] for r in records}
        codes = {rank: f.exitcode for rank, f in err.failures.items()}
        abrupt = sorted(started - recorded)
        # deaths the agent itself saw, and those the first rank to fail saw: already gone when it failed
        gone_first = set(records[0].get("dead", [])) if records else set()
        killed = [r for r in abrupt if codes.get(r) is not None or r in gone_first]
        unknown = [r for r in abrupt if r not in killed]  # probably stopped by the agent afterwards
        # SIGKILLed ranks while the memory cgroup counted OOM kills: the kernel's out-of-memory killer
        oom = [r for r in killed if codes.get(r, -signal.SIGKILL) == -signal.SIGKILL] if oom_kills else []
        self.out_of_memory = bool(oom)
        limit = f", memory limit {memory_limit / 2**30:.2f} GiB" if memory_limit else ""
        lines = [f"worker rank {r} was killed: out of memory (the kernel's out-of-memory killer, counted by this "
                 f"job's memory cgroup{limit})" for r in oom]
        lines += [f"worker rank {r} died abruptly ({_exit_code(codes.get(r))}): killed by a signal, the "
                  "out-of-memory killer, or a crash in native code" for r in killed if r not in oom]
        if records and records[0].get("timed_out") and not lines:  # a peer stopped answering
            lines.append(self._hung(records[0], unknown))
            lines += [f"worker rank {r['rank']} gave up: {r['error'].splitlines()[0]}" for r in records]
            records, unknown = [], []
        for i, record in enumerate(records):
            if i == 0 and not lines:
                lines.append(f"worker rank {record['rank']} failed first: {record['error']}")
                lines.append(record["traceback"].rstrip())
            else:
                lines.append(f"worker rank {record['rank']} failed after it: {record['error'].splitlines()[0]}")
        lines += [f"worker rank {r} died abruptly (no Python error recorded): killed by a signal, the "
                  "out-of-memory killer, or a crash in native code" for r in unknown]
        if not lines:
            lines = [f"worker rank {rank} exited with code {code}" for rank, code in sorted(codes.items())]
        super().__init__("\n".join(lines))


    @staticmethod
    def _hung(first: dict, silent: list[int]) -> str:
        """A collective timed out: name the rank(s) that stopped answering, and where."""
        stopped = first.get("stopped") or []
        suspects = stopped or silent
        who = ", ".join(map(str, suspects)) or "another rank"
        why = ("its process is stopped (SIGSTOP or a debugger)" if stopped else
               "it raised no error of its own: stopped, hung or far slower than the others")
        where = f" in {first['where']}" if first.get("where") else ""
        return (f"worker rank {who} stopped answering ({why}): rank {first['rank']} waited for it{where} until "
                f"strategy.timeout_s ran out, then the group was torn down. Raise strategy.timeout_s for slow steps "
                f"(a long checkpoint, a first compile); with trainer.max_restarts>0 the group restarts from the "
                f"newest checkpoint.")


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
