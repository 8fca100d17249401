"""`cluster=slurm`: processes started by `srun`; ranks, the main node and requeueing from SLURM."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess

from framework.cluster.base import ClusterEnvironment
from framework.errors import ConfigError

# Job names SLURM gives interactive allocations: a shell in them is not a training job.
INTERACTIVE_JOB_NAMES = ("bash", "interactive")


def expand_nodelist(nodelist: str) -> list[str]:
    """Every host of a SLURM node list, in order: `n1`, `n[1-3,5]`, `a[01-02],b3` (zero padding
    kept), `rack[1-2]-gpu[01-02]` (several ranges in one name)."""
    hosts: list[str] = []
    for item in _split_top_level(nodelist.strip()):
        hosts.extend(_expand_one(item))
    return hosts


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise ConfigError(f"SLURM node list '{text}' has unbalanced brackets.")
    parts.append(current)
    return [p for p in parts if p]


def _expand_one(name: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", name)
    if match is None:
        return [name]
    head, tail = name[: match.start()], name[match.end():]
    out = []
    for part in match.group(1).split(","):
        if "-" in part:
            low, high = part.split("-", 1)
            width = len(low)
            out.extend(f"{head}{i:0{width}d}" for i in range(int(low), int(high) + 1))
        else:
            out.append(f"{head}{part}")
    return [host for prefix in out for host in _expand_one(prefix + tail)]


def _tasks_per_node(value: str) -> list[int]:
    """SLURM_TASKS_PER_NODE, e.g. `2(x3),1` -> [2, 2, 2, 1]."""
    counts = []
    for part in value.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise ConfigError(f"SLURM_TASKS_PER_NODE='{value}' is not in SLURM's format.")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


class SLURMEnvironment(ClusterEnvironment):
    """Every process is a task `srun` started: world size, ranks and node come from SLURM_NTASKS,
    SLURM_PROCID, SLURM_LOCALID and SLURM_NODEID; the main address is the first host of the
    job's node list; the port is MASTER_PORT, else derived from the job id (every task of a job
    derives the same one, and concurrent jobs on a node different ones).

    Requeueing: SLURM sends `requeue_signal` before it preempts or times out a job that asked
    for it (`#SBATCH --signal=USR1@90`); the run then saves a checkpoint at the next step
    boundary, and with `auto_requeue` rank zero calls `scontrol requeue`. The requeued job has the
    same job id, so its run directory (named after the job by default) is the same and it resumes
    from that checkpoint by itself."""

    name = "slurm"

    def __init__(self, auto_requeue: bool = True, requeue_signal: str = "SIGUSR1"):
        """auto_requeue: requeue the job (`scontrol requeue`) after saving on `requeue_signal`.
        requeue_signal: the signal SLURM sends ahead of preemption (`--signal=USR1@90` sends SIGUSR1)."""
        if not hasattr(signal, requeue_signal):
            raise ConfigError(f"cluster.requeue_signal={requeue_signal}: not a signal name (e.g. SIGUSR1, SIGTERM).")
        self.auto_requeue = auto_requeue
        self.requeue_signal = requeue_signal

    @staticmethod
    def detect() -> bool:
        return "SLURM_NTASKS" in os.environ and os.environ.get("SLURM_JOB_NAME") not in INTERACTIVE_JOB_NAMES

    @property
    def creates_processes_externally(self) -> bool:
        # In the batch script itself (no job step yet) the framework starts the processes;
        # under `srun` every task is already a process.
        return "SLURM_STEP_ID" in os.environ and "SLURM_PROCID" in os.environ

    @property
    def main_address(self) -> str:
        if "MASTER_ADDR" in os.environ:
            return os.environ["MASTER_ADDR"]
        if not self.creates_processes_externally:  # the framework starts the processes on this node
            return "127.0.0.1"
        nodelist = os.environ.get("SLURM_JOB_NODELIST", os.environ.get("SLURM_NODELIST", "127.0.0.1"))
        return expand_nodelist(nodelist)[0]

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" in os.environ:
            return int(os.environ["MASTER_PORT"])
        if not self.creates_processes_externally:
            return 0  # a free port
        return 15000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 10000

    @property
    def job_id(self) -> str:
        """The job id, `<array job>_<task>` for a task of an array job."""
        if "SLURM_ARRAY_JOB_ID" in os.environ and "SLURM_ARRAY_TASK_ID" in os.environ:
            return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
        return os.environ.get("SLURM_JOB_ID", "")

    @property
    def restarted(self) -> bool:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0

    def world_size(self) -> int:
        return int(os.environ["SLURM_NTASKS"])

    def global_rank(self) -> int:
        return int(os.environ.get("SLURM_PROCID", 0))

    def local_rank(self) -> int:
        return int(os.environ.get("SLURM_LOCALID", 0))

    def node_rank(self) -> int:
        return int(os.environ.get("SLURM_NODEID", 0))

    def preemption_signals(self) -> list[str]:
        return [self.requeue_signal]

    def validate(self, devices: int, num_nodes: int) -> None:
        if not self.creates_processes_externally:
            return
        nodes = int(os.environ.get("SLURM_NNODES", os.environ.get("SLURM_JOB_NUM_NODES", "1")))
        if nodes != num_nodes:
            raise ConfigError(f"num_nodes={num_nodes}, but this SLURM job step runs on {nodes} node(s) "
                              f"(SLURM_NNODES={nodes}): set num_nodes={nodes}, or srun --nodes={num_nodes}.")
        per_node = _tasks_per_node(os.environ["SLURM_TASKS_PER_NODE"]) if "SLURM_TASKS_PER_NODE" in os.environ else []
        if per_node and any(count != devices for count in per_node):
            raise ConfigError(f"devices={devices}, but SLURM starts {os.environ['SLURM_TASKS_PER_NODE']} task(s) "
                              f"per node (SLURM_TASKS_PER_NODE): set devices={per_node[0]}, or "
                              f"srun --ntasks-per-node={devices}.")
        if self.world_size() != devices * num_nodes:
            raise ConfigError(f"devices={devices} x num_nodes={num_nodes} = {devices * num_nodes} processes, but "
                              f"SLURM started {self.world_size()} task(s) (SLURM_NTASKS): srun "
                              f"--ntasks={devices * num_nodes}, or set devices/num_nodes to match.")

    def on_preempted(self, say) -> None:
        if not self.auto_requeue or not self.job_id:
            return
        if shutil.which("scontrol") is None:
            say("scontrol is not on PATH: the job was not requeued")
            return
        # said first: SLURM cancels this step as soon as the job is requeued
        say(f"requeueing SLURM job {self.job_id}: SLURM stops this step now and starts the job again, which "
            "continues from this checkpoint by itself")
        result = subprocess.run(["scontrol", "requeue", self.job_id], capture_output=True, text=True)
        if result.returncode != 0:
            say(f"`scontrol requeue {self.job_id}` failed: {result.stderr.strip() or result.stdout.strip()}")
            return
        self.requeued = True
