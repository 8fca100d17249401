"""A real one-node SLURM cluster on this machine, for the tests: Debian's slurm-wlm and munge,
installed and started when the machine allows it (root, apt-get). `ensure_slurm()` returns None
when `srun` works, else the reason it cannot (the tests then skip, showing it)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

CONF = Path("/etc/slurm/slurm.conf")
MUNGE_KEY = Path("/etc/munge/munge.key")


def _run(*cmd: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def _install() -> str | None:
    if shutil.which("slurmctld") and shutil.which("munged") and shutil.which("srun"):
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "SLURM is not installed and this machine cannot install it (needs root and apt-get)"
    result = _run("apt-get", "install", "-y", "-q", "slurm-wlm", "munge")
    if result.returncode != 0:  # no package lists yet on a fresh machine
        _run("apt-get", "update", "-q")
        result = _run("apt-get", "install", "-y", "-q", "slurm-wlm", "munge")
    if result.returncode != 0:
        return f"apt-get install slurm-wlm munge failed: {result.stderr.strip().splitlines()[-1:]}"
    return None


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 - 1024
    return 4096


def _configure() -> bool:
    """Write the test cluster's munge key and slurm.conf; True when slurm.conf changed."""
    host = socket.gethostname().split(".")[0]
    if not MUNGE_KEY.exists():
        MUNGE_KEY.parent.mkdir(parents=True, exist_ok=True)
        MUNGE_KEY.write_bytes(os.urandom(1024))
        shutil.chown(MUNGE_KEY, "munge", "munge")
        MUNGE_KEY.chmod(0o400)
    for path in ("/var/spool/slurmctld", "/var/spool/slurmd", "/var/log/slurm", "/run/munge"):
        Path(path).mkdir(parents=True, exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    CONF.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join([
        "ClusterName=framework-tests", f"SlurmctldHost={host}", "SlurmUser=root", "AuthType=auth/munge",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core", "StateSaveLocation=/var/spool/slurmctld", "SlurmdSpoolDir=/var/spool/slurmd",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log", "SlurmdLogFile=/var/log/slurm/slurmd.log",
        "ReturnToService=2", "MpiDefault=none", "JobRequeue=1", "KillWait=5",
        # A requeued job may start again only once its old credential expired (default 120 s), and
        # then at the main scheduler's next pass over pending jobs (default every 60 s).
        "AuthInfo=cred_expire=10", "SchedulerParameters=sched_interval=5",
        f"NodeName={host} CPUs={os.cpu_count()} RealMemory={_memory_mb()} State=UNKNOWN",
        f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
    ]) + "\n"
    if CONF.exists() and CONF.read_text() == text:
        return False
    CONF.write_text(text)
    return True


def _running(name: str) -> bool:
    return _run("pgrep", "-x", name).returncode == 0


def _node_idle() -> bool:
    result = _run("sinfo", "-h", "-o", "%T")
    return result.returncode == 0 and any(s.strip().rstrip("*") in ("idle", "mixed", "allocated")
                                          for s in result.stdout.splitlines())


def ensure_slurm() -> str | None:
    try:
        reason = _install()
        if reason:
            return reason
        if CONF.exists() and "framework-tests" not in CONF.read_text() and _node_idle():
            return None  # a SLURM of this machine's own: use it as it is
        if _configure():  # new or changed settings: (re)start the daemons with them
            _run("pkill", "-x", "slurmctld")
            _run("pkill", "-x", "slurmd")
            time.sleep(2)
        if not _running("munged"):
            _run("runuser", "-u", "munge", "--", "/usr/sbin/munged")
        if not _running("slurmctld"):
            _run("/usr/sbin/slurmctld")
        if not _running("slurmd"):
            _run("/usr/sbin/slurmd")
        for _ in range(60):
            if _node_idle():
                return None
            time.sleep(1)
        host = socket.gethostname().split(".")[0]
        _run("scontrol", "update", f"nodename={host}", "state=resume")
        time.sleep(2)
        return None if _node_idle() else f"SLURM started but its node never became idle: {_run('sinfo').stdout}"
    except (OSError, subprocess.SubprocessError, KeyError, LookupError) as err:
        return f"could not start SLURM here: {type(err).__name__}: {err}"


if __name__ == "__main__":
    print(ensure_slurm() or "SLURM is up")
