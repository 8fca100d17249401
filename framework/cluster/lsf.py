"""`cluster=lsf`: IBM Spectrum LSF, processes started by `jsrun`."""
from __future__ import annotations

import os
import socket
from pathlib import Path

from framework.cluster.base import ClusterEnvironment
from framework.errors import ConfigError

REQUIRED = ("LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_LOCAL_RANK")


def compute_hosts(rankfile: Path) -> list[str]:
    """The job's compute hosts, in order, from LSF's rank file (one line per slot; the first
    line is the launch node, which runs no task)."""
    try:
        lines = [line.strip() for line in Path(rankfile).read_text().splitlines() if line.strip()]
    except OSError as err:
        raise ConfigError(f"LSB_DJOB_RANKFILE={rankfile} cannot be read ({err.strerror}).") from err
    hosts: list[str] = []
    for host in lines[1:]:
        if host not in hosts:
            hosts.append(host)
    if not hosts:
        raise ConfigError(f"LSB_DJOB_RANKFILE={rankfile} lists no compute host.")
    return hosts


class LSFEnvironment(ClusterEnvironment):
    """World size and ranks from jsrun's JSM_NAMESPACE_SIZE / _RANK / _LOCAL_RANK; the main
    address is the first compute host of the rank file and the node rank this host's place in
    it; the port is MASTER_PORT, else derived from LSB_JOBID."""

    name = "lsf"

    @staticmethod
    def detect() -> bool:
        return all(key in os.environ for key in REQUIRED)

    @property
    def creates_processes_externally(self) -> bool:
        return True

    def _hosts(self) -> list[str]:
        return compute_hosts(Path(os.environ["LSB_DJOB_RANKFILE"]))

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR") or self._hosts()[0]

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" in os.environ:
            return int(os.environ["MASTER_PORT"])
        return 10000 + int(os.environ["LSB_JOBID"]) % 10000

    def world_size(self) -> int:
        return int(os.environ["JSM_NAMESPACE_SIZE"])

    def global_rank(self) -> int:
        return int(os.environ["JSM_NAMESPACE_RANK"])

    def local_rank(self) -> int:
        return int(os.environ["JSM_NAMESPACE_LOCAL_RANK"])

    def node_rank(self) -> int:
        hosts, me = self._hosts(), socket.gethostname()
        for candidate in (me, me.split(".")[0]):
            if candidate in hosts:
                return hosts.index(candidate)
        raise ConfigError(f"this host ({me}) is not among the compute hosts of LSB_DJOB_RANKFILE "
                          f"({', '.join(hosts)}).")

    def validate(self, devices: int, num_nodes: int) -> None:
        missing = [key for key in REQUIRED if key not in os.environ]
        if missing:
            raise ConfigError(f"cluster=lsf, but {', '.join(missing)} is not set: start the run with jsrun inside "
                              "an LSF job.")
        nodes = len(self._hosts())
        if nodes != num_nodes:
            raise ConfigError(f"num_nodes={num_nodes}, but the LSF job has {nodes} compute host(s) "
                              f"(LSB_DJOB_RANKFILE): set num_nodes={nodes}.")
        if self.world_size() != devices * num_nodes:
            raise ConfigError(f"devices={devices} x num_nodes={num_nodes} = {devices * num_nodes} processes, but jsrun "
                              f"started {self.world_size()} (JSM_NAMESPACE_SIZE): set devices="
                              f"{self.world_size() // max(nodes, 1)}.")
