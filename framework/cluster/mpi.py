"""`cluster=mpi`: processes started by `mpirun`/`mpiexec`; ranks and the rendezvous through mpi4py."""
from __future__ import annotations

import os
import socket
from functools import cached_property

from framework.cluster.base import ClusterEnvironment
from framework.errors import ConfigError

# Variables the common MPI launchers set in every process (Open MPI, MPICH/Hydra, Intel MPI, PMIx).
MPI_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE")


class MPIEnvironment(ClusterEnvironment):
    """Ranks from MPI_COMM_WORLD; the local rank from a split by shared memory (one
    communicator per node); the node rank from the order of the nodes' first ranks. Rank 0
    picks a free port on its host and sends its address and port to every rank. mpi4py is
    imported only when this environment is chosen or detected."""

    requires_packages = {"mpi4py": "'framework[mpi]'"}

    name = "mpi"

    @staticmethod
    def detect() -> bool:
        return any(key in os.environ for key in MPI_VARIABLES)

    @cached_property
    def _comm(self):
        try:
            from mpi4py import MPI
        except ImportError as err:
            raise ConfigError("cluster=mpi needs mpi4py: pip install mpi4py (and an MPI such as Debian's "
                              "openmpi-bin).") from err
        return MPI

    @cached_property
    def _layout(self) -> dict:
        MPI = self._comm
        world = MPI.COMM_WORLD
        local = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
        local_rank = local.Get_rank()
        # Node ranks: the nodes ordered by their lowest global rank.
        leaders = world.allgather(world.Get_rank() if local_rank == 0 else None)
        leader_of_mine = local.bcast(world.Get_rank() if local_rank == 0 else None, root=0)
        node_rank = sorted(r for r in leaders if r is not None).index(leader_of_mine)
        if world.Get_rank() == 0:
            address = os.environ.get("MASTER_ADDR") or socket.gethostbyname(socket.gethostname())
            port = int(os.environ["MASTER_PORT"]) if "MASTER_PORT" in os.environ else _free_port()
            main = (address, port)
        else:
            main = None
        address, port = world.bcast(main, root=0)
        return {"size": world.Get_size(), "rank": world.Get_rank(), "local_rank": local_rank,
                "local_size": local.Get_size(), "node_rank": node_rank,
                "nodes": sum(r is not None for r in leaders), "address": address, "port": port}

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return self._layout["address"]

    @property
    def main_port(self) -> int:
        return self._layout["port"]

    def world_size(self) -> int:
        return self._layout["size"]

    def global_rank(self) -> int:
        return self._layout["rank"]

    def local_rank(self) -> int:
        return self._layout["local_rank"]

    def node_rank(self) -> int:
        return self._layout["node_rank"]

    def validate(self, devices: int, num_nodes: int) -> None:
        layout = self._layout
        if layout["nodes"] != num_nodes:
            raise ConfigError(f"num_nodes={num_nodes}, but mpirun placed the {layout['size']} process(es) on "
                              f"{layout['nodes']} node(s): set num_nodes={layout['nodes']}.")
        if layout["local_size"] != devices:
            raise ConfigError(f"devices={devices}, but mpirun started {layout['local_size']} process(es) on this node: "
                              f"set devices={layout['local_size']} (or mpirun -npernode {devices}).")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
