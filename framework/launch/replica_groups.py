"""One command, every replica group (fault_tolerance=torchft on one machine): a torchft lighthouse,
and one `train` command per group, each a run of its own in <run dir>/replica_<g>, restarted when
it dies (it then heals from a live peer: framework/fault_tolerance/torchft.py).

A group started again gets `resume=auto`: where it has checkpoints of its own it loads the newest
first, and whatever it loads, the quorum copies a live peer's newer state over it. A group that
dies (a signal, a crash: exit 1) is restarted up to fault_tolerance.restarts times; one that stops
for a reason a restart would meet again (a bad config: 2, non-finite numbers: 3, storage: 74, a
preemption: 75) stops every group, and the command exits with its code. The run directory's
summary.json gathers the groups' own.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from framework.config.build import build
from framework.errors import ExitCode, RunExit, UserError
from framework.fault_tolerance.torchft import quiet_torchft
from framework.launch.elastic import CORES_ENV
from framework.sweep_record import SUMMARY_FILE

#: why a sweep cannot have this command start its groups (refused before any job, and by a job itself)
GROUPS_IN_A_SWEEP = ("fault_tolerance=torchft in a sweep: each job would start a lighthouse and every group of its own; "
                     "run the jobs one by one, or start a lighthouse (`framework lighthouse`) and give each group its "
                     "fault_tolerance.replica_id and fault_tolerance.lighthouse.")
#: overrides the command sets for each group (a user's own are replaced; resume= in a restarted group's)
GROUP_KEYS = ("fault_tolerance.replica_id=", "fault_tolerance.lighthouse=", "hydra.run.dir=")


@dataclass
class Group:
    index: int
    out: Path
    process: subprocess.Popen | None = None
    relay: threading.Thread | None = None
    starts: list[float] = field(default_factory=list)
    exits: list[int] = field(default_factory=list)


def group_devices(visible: list[str], groups: int, per_group: int) -> list[list[str]]:
    """Each group's devices: consecutive blocks of `visible`, group g the g-th; where there are fewer
    than groups x per_group the blocks wrap around, so groups share devices (a group's own stay
    distinct while per_group <= len(visible))."""
    return [[visible[(g * per_group + i) % len(visible)] for i in range(per_group)] for g in range(groups)]


def placement(accelerator, per_group: int, groups: int) -> list[dict]:
    """Each group's environment that hands it its own devices (CUDA_VISIBLE_DEVICES: a block of the
    GPUs this command sees, as their ids or UUIDs there); nothing for an accelerator whose devices
    cannot be handed out (the CPU's cores are split by FRAMEWORK_CORES instead)."""
    variable = getattr(accelerator, "visible_devices_env", None)
    if variable is None:
        return [{} for _ in range(groups)]
    listed = [d.strip() for d in os.environ.get(variable, "").split(",") if d.strip()]
    visible = (listed or [str(i) for i in range(accelerator.max_devices())])[:accelerator.max_devices()]
    return [{variable: ",".join(ids)} for ids in group_devices(visible, groups, per_group)]


def launches_groups(cfg) -> bool:
    """Whether this command starts every replica group (fault_tolerance=torchft without a replica_id)."""
    return bool(cfg.get("fault_tolerance")) and build(cfg.fault_tolerance, "fault_tolerance").launches_groups


def start_lighthouse(ft, port: int = 0):
    """torchft's lighthouse in this process (its own Rust server): (server, address)."""
    quiet_torchft()
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(bind=f"[::]:{port}", min_replicas=ft.min_replicas, join_timeout_ms=ft.join_timeout_ms,
                              quorum_tick_ms=100, heartbeat_timeout_ms=ft.heartbeat_timeout_ms)
    return server, server.address()


def group_command(argv: list[str], index: int, lighthouse: str, out: Path, restarted: bool) -> list[str]:
    """This command line (sys.argv) again, as replica group `index` joining `lighthouse`."""
    replaced = (*GROUP_KEYS, "resume=") if restarted else GROUP_KEYS
    kept = [a for a in argv[1:] if not a.lstrip("+~").startswith(replaced)]
    return [sys.executable, argv[0], *kept, f"fault_tolerance.replica_id={index}", f"fault_tolerance.lighthouse={lighthouse}",
            f"hydra.run.dir={out}", *(["resume=auto"] if restarted else [])]


def relay(stream, prefix: str) -> None:
    """A group's output, line by line, on this command's, each line naming its group."""
    for line in stream:
        sys.stdout.write(prefix + line)
        sys.stdout.flush()


def supervise(ft, argv: list[str], output_dir: Path, say, devices: list[dict] | None = None) -> dict:
    """Start the lighthouse and every group; restart a group that dies; return the run's summary
    (each group's summary.json, and whether their final weights agree). `devices`: each group's
    environment from `placement` (its own GPUs). Leaves with exit 1 when a group dies more than
    fault_tolerance.restarts times, with a group's own code when it stops for a reason a restart
    would meet again (UserError: its config)."""
    server, address = start_lighthouse(ft, 0 if ft.port == "auto" else int(ft.port))
    say(f"fault_tolerance: lighthouse at {address}; {ft.replica_groups} replica groups, min_replicas {ft.min_replicas}")
    groups = [Group(i, output_dir / f"replica_{i}") for i in range(ft.replica_groups)]

    # the groups share this machine's cores (a one-process group's torch threads, a group's workers)
    cores = str(max(1, (os.cpu_count() or 1) // ft.replica_groups))
    env = {**os.environ, CORES_ENV: cores, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", cores)}
    devices = devices or [{} for _ in groups]
    for group, own in zip(groups, devices):
        if own:
            say(f"fault_tolerance: group {group.index} on " + ", ".join(f"{k}={v}" for k, v in own.items()))

    def start(group: Group) -> None:
        restarted = bool(group.starts)
        group.out.mkdir(parents=True, exist_ok=True)
        group.process = subprocess.Popen(group_command(argv, group.index, address, group.out, restarted),
                                         env={**env, **devices[group.index]},
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        group.relay = threading.Thread(target=relay, args=(group.process.stdout, f"[group {group.index}] "), daemon=True)
        group.relay.start()
        group.starts.append(time.time())
        if restarted:
            say(f"fault_tolerance: group {group.index} restarted ({len(group.starts) - 1} of {ft.restarts}); it heals "
                "from a live peer")

    def passed_on(signum, frame):  # the groups are told (they save and stop) before this command leaves
        raise RunExit(ExitCode.PREEMPTED)

    previous = signal.signal(signal.SIGTERM, passed_on)
    try:
        for group in groups:
            start(group)
        while any(g.process is not None for g in groups):
            time.sleep(0.2)
            for group in groups:
                code = group.process.poll() if group.process is not None else None
                if code is None:
                    continue
                group.exits.append(code)
                group.process = None
                group.relay.join(timeout=10)  # its last lines out before anything is said of it
                if code == ExitCode.OK:
                    continue
                if code == ExitCode.USER_ERROR:
                    raise UserError(f"fault_tolerance: group {group.index} stopped for its config (exit 2; its message "
                                    "is above); the other groups were stopped.")
                if code > 0 and code != ExitCode.FAILED:  # diverged, storage, preempted: a restart would meet it again
                    say(f"fault_tolerance: group {group.index} stopped with exit {code} (its message is above); the "
                        "other groups are stopped")
                    raise RunExit(code)
                if len(group.starts) > ft.restarts:
                    say(f"fault_tolerance: group {group.index} died {len(group.starts)} times (exit {code}; "
                        f"fault_tolerance.restarts={ft.restarts}); the other groups are stopped. Its log: {group.out}")
                    raise RunExit(ExitCode.FAILED)
                say(f"fault_tolerance: group {group.index} died (exit {code}); the others go on without it")
                start(group)
    finally:
        stop_groups(groups)
        server.shutdown()
        signal.signal(signal.SIGTERM, previous)
    return gathered(groups)


def stop_groups(groups: list[Group], grace_s: float = 30.0) -> None:
    """A SIGTERM to every group still running: each saves at its next step and stops (its launcher
    passes the signal on to its workers). A group still running after `grace_s` (its workers stuck)
    gets a second one, on which its launcher stops its workers itself, and SIGKILL last."""
    for wait_s in (grace_s, grace_s + 10):  # the second: the agent's own 30 s join, then its SIGKILL
        running = [g for g in groups if g.process is not None and g.process.poll() is None]
        for group in running:
            group.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        for group in running:
            try:
                group.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    for group in groups:
        if group.process is not None and group.process.poll() is None:
            group.process.kill()
            group.process.wait()


def gathered(groups: list[Group]) -> dict:
    """The groups' summaries side by side, with whether their final weights agree."""
    summaries = []
    for group in groups:
        try:
            summary = json.loads((group.out / SUMMARY_FILE).read_text())
        except (OSError, ValueError):
            summary = {}
        summaries.append({"replica_id": group.index, "run_dir": str(group.out), "starts": len(group.starts),
                          "started_at": group.starts, "exits": group.exits, **summary})
    digests = {s.get("replicas", {}).get("weights_sha256") for s in summaries}
    return {"replica_groups": summaries, "weights_agree": len(digests) == 1 and None not in digests}
