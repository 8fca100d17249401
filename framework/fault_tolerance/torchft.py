"""`fault_tolerance=torchft`: replica groups over the data-parallel dimension, on torchft.

The run's data-parallel dimension is split into `replica_groups` groups of `devices x num_nodes`
processes each (any layout of ddp or the FSDP2 family within a group). A lighthouse (torchft's own)
forms a quorum of the live groups before every step; a step's gradients are averaged over the groups
in it (torchft's rule: each group's mean gradient, averaged over the groups that took part), and the
groups vote on the commit, so a group that dies mid-step costs the others that step's update, not
the run. A group that (re)joins behind the others copies the whole training state of the same rank
of a live peer (weights, optimizer state, the loop's step, data position, scheduler and RNG) before
its first forward, and goes on from there: nothing it trained before is trained again, nothing the
others trained is skipped. Each group reads its own share of every step's samples (group g of G
takes the g-th of G slices of the data-parallel order); while a group is away its share of those
steps is not trained (the others do not take it over), which the per-step `train/replicas` shows.
Before the gradients, one small collective carries the step's loss (train/loss is the groups' mean)
and a digest of what each rank holds: groups whose ranks hold different parts never average.

Built on torchft's Manager, its fault-tolerant ProcessGroupGloo (or ProcessGroupNCCL) and its HTTP
checkpoint transport; nothing of the quorum, the transport or the lighthouse is the framework's own.
Groups started by one command on a GPU machine get GPUs of their own (framework/launch/replica_groups.py).
"""
from __future__ import annotations

import gc
import logging
import os
import time
import warnings
from datetime import timedelta
from typing import Literal

import torch
from torch.distributed import TCPStore

from framework.config.types import NonNegativeInt, PositiveFloat, PositiveInt
from framework.console import warn
from framework.errors import ConfigError
from framework.fault_tolerance.base import FaultTolerance, GroupLayout, Heal, ReplicaRecord


def quiet_torchft() -> None:
    """torchft's Rust servers and Python loggers say every quorum and commit at INFO; the framework
    says what a user needs (heals, groups that died). RUST_LOG (read when torchft is imported) and
    the log levels are left alone where a user set them."""
    os.environ.setdefault("RUST_LOG", "warn")
    for name in ("torchft", "torchft_quorums", "torchft_commits", "torchft_errors"):
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)
    # said at every quorum on a machine without NCCL, and by every heal's deserialisation
    logging.getLogger("torchft.manager").addFilter(lambda record: "flight recorder" not in record.getMessage())
    warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)


def _quorum_group(plugin: "TorchFT", timeout: timedelta):
    """torchft's reconfigurable process group of `plugin.process_group` (gloo or nccl), which also
    notes a quorum holding two groups of one replica_id (torchft numbers a group's ranks by its id:
    both would take the same places)."""
    from torchft import process_group

    base = process_group.ProcessGroupNCCL if plugin.process_group == "nccl" else process_group.ProcessGroupGloo
    if plugin.process_group == "nccl":  # torchft's default (and its warning) otherwise; a step's limit is ours
        os.environ.setdefault("TORCH_NCCL_NONBLOCKING_TIMEOUT", str(timeout.total_seconds()))

    class Checked(base):
        def configure(self, store_addr, replica_id, rank, world_size, quorum_id=None, group_rank=None,
                      group_world_size=None, global_ranks=None):
            if global_ranks is not None and len(set(global_ranks)) < len(global_ranks):
                plugin._duplicate_id = True  # raised on the loop's thread, at the step's start
            super().configure(store_addr, replica_id, rank, world_size, quorum_id, group_rank, group_world_size,
                              global_ranks)

    return Checked(timeout=timeout)


_CODE_CHUNKS = 8  # 16-bit pieces of a layout's digest compared between groups


def _layout_code(layout: GroupLayout | None, device) -> torch.Tensor:
    """A layout's digest as small whole numbers and their squares (float64, exact): averaged over
    the groups, the pieces equal their squares' average squared only where every group's are the same."""
    if layout is None:
        return torch.zeros(2 * _CODE_CHUNKS, dtype=torch.float64, device=device)
    pieces = torch.tensor([int.from_bytes(layout.digest[2 * i:2 * i + 2], "big") for i in range(_CODE_CHUNKS)],
                          dtype=torch.float64, device=device)
    return torch.cat([pieces, pieces * pieces])


def _codes_differ(averaged: torch.Tensor) -> bool:
    """Whether the groups' layout codes (averaged, see _layout_code) were not all the same: the
    pieces' variance over the groups, exactly 0 where they were."""
    pieces, squares = averaged[:_CODE_CHUNKS], averaged[_CODE_CHUNKS:]
    return bool(((squares - pieces * pieces).abs() > 1e-6).any())


def _layout_record(layout: GroupLayout | None) -> dict | None:
    return None if layout is None else {"words": layout.words, "digest": layout.digest.hex()}


class TorchFT(FaultTolerance):
    """Replica groups coordinated by a torchft lighthouse (torchtitan's fault-tolerant DDP)."""

    name = "torchft"
    requires_packages = {"torchft": "'framework[torchft]'"}
    #: a replica group is any layout whose rank r holds the same part of the state and gradients in
    #: every group (ddp; any mesh of the FSDP2 family: fsdp, hsdp, tensor parallel, pipeline stages,
    #: offloaded), so a heal copies rank to rank and the average is per part; a strategy that cannot
    #: be one says why (its replica_groups_refusal)
    forms_groups = True

    def __init__(self, replica_groups: PositiveInt = 2, replica_id: NonNegativeInt | None = None,
                 min_replicas: PositiveInt = 1, lighthouse: str = "auto", quorum_timeout_s: PositiveFloat = 60.0,
                 step_timeout_s: PositiveFloat = 60.0, connect_timeout_s: PositiveFloat = 10.0,
                 heartbeat_timeout_ms: PositiveInt = 5000, join_timeout_ms: NonNegativeInt = 1000,
                 restarts: NonNegativeInt = 3, port: NonNegativeInt | Literal["auto"] = "auto",
                 process_group: Literal["gloo", "nccl"] = "gloo"):
        """replica_groups: groups the data-parallel dimension is split into; replica_id: this group's
        (null: this command starts every group and a lighthouse on this machine); min_replicas:
        groups a step needs to commit; lighthouse: host:port of a lighthouse (`framework
        lighthouse`), or auto (started with the groups); quorum_timeout_s, step_timeout_s,
        connect_timeout_s: how long a quorum (and at a fresh run's first step, the wait for every
        group), a step's collectives and heal, and reaching the lighthouse or a peer may take;
        heartbeat_timeout_ms: silence after which the lighthouse counts a group gone;
        join_timeout_ms: how long it waits for more groups once min_replicas have joined; restarts:
        times the local launch restarts a dead group; port: the lighthouse's port when this command
        starts it (auto: a free one); process_group: what carries the gradient average between
        groups (gloo: any device, CUDA tensors through host memory; nccl: GPU to GPU, each group on
        GPUs of its own)."""
        self.replica_groups = int(replica_groups)
        self.replica_id = replica_id
        self.group = int(replica_id or 0)
        self.min_replicas = int(min_replicas)
        self.lighthouse = lighthouse
        self.quorum_timeout_s = float(quorum_timeout_s)
        self.step_timeout_s = float(step_timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.heartbeat_timeout_ms = int(heartbeat_timeout_ms)
        self.join_timeout_ms = int(join_timeout_ms)
        self.restarts = int(restarts)
        self.port = port
        self.process_group = process_group
        self._manager = None
        self._store = None
        self._healed_now = False
        self._resumed = None  # torchft's state from a checkpoint, applied once the group has joined
        self._first_step = True  # this process's first step: it waits for every group
        self._duplicate_id = False  # set by the quorum's process group: two groups of one replica_id
        self._record = ReplicaRecord(self.group)
        self._layout: GroupLayout | None = None  # what this rank holds (join)
        self._layout_code = _layout_code(None, "cpu")  # join sets this rank's
        self._peer_layout: str | None = None  # a live peer's, where a heal found it differs from this rank's
        self._new_in_quorum = True  # this group joins the quorum at the current step (first step, or healed)
        self._speaks = True

    @property
    def launches_groups(self) -> bool:
        return self.replica_id is None

    def resolve_devices(self, accelerator, devices) -> int:
        """devices=auto where this command starts every group on a GPU machine: each group an equal
        block of the GPUs (framework/launch/replica_groups.py hands them out), not all of them each."""
        if devices == "auto" and self.launches_groups and accelerator.visible_devices_env is not None:
            return max(1, accelerator.max_devices() // self.replica_groups)
        return accelerator.resolve_devices(devices)

    def problems(self) -> list[str]:
        found = []
        if self.min_replicas > self.replica_groups:
            found.append(f"fault_tolerance.min_replicas={self.min_replicas} is more than fault_tolerance.replica_groups="
                         f"{self.replica_groups}: no step could ever commit; lower min_replicas or add groups.")
        if self.replica_id is not None and self.replica_id >= self.replica_groups:
            found.append(f"fault_tolerance.replica_id={self.replica_id}: the groups are numbered 0 to "
                         f"{self.replica_groups - 1} (fault_tolerance.replica_groups={self.replica_groups}); give each "
                         "group its own id in that range.")
        if self.replica_id is not None and self.lighthouse == "auto":
            found.append(f"fault_tolerance.replica_id={self.replica_id} with fault_tolerance.lighthouse=auto: a group "
                         "started on its own joins a lighthouse that runs already; start one with `framework "
                         "lighthouse` and pass its address (fault_tolerance.lighthouse=HOST:PORT), or drop replica_id to "
                         "start every group from this command.")
        return found

    # ---- in every process of a group ------------------------------------------------------
    def join(self, strategy, state_dict, load_state_dict, layout: GroupLayout | None = None) -> None:
        quiet_torchft()
        from torchft.manager import Manager

        host = os.environ.get("MASTER_ADDR", "localhost")
        if strategy.global_rank == 0:  # the group's own store, where its ranks find the manager
            self._store = TCPStore(host, 0, is_master=True, wait_for_workers=False)
        port = self._store.port if self._store is not None else None
        if strategy.world_size > 1:
            port = strategy.broadcast(port)
        step_timeout = timedelta(seconds=self.step_timeout_s)

        self._layout = layout
        self._layout_code = _layout_code(layout, strategy.root_device)
        self._speaks = strategy.is_global_zero

        def give():  # what the same rank of a healing group copies, with what this rank holds
            return {**state_dict(), "group_layout": _layout_record(layout)}

        def load(state):
            peer = state.get("group_layout")
            if layout is not None and peer is not None and peer["digest"] != layout.digest.hex():
                self._peer_layout = peer["words"]  # nothing copied: begin_step stops this group
                return
            started = time.perf_counter()
            load_state_dict(state)
            self._healed_now = True
            self._record.heals.append(Heal(int(state["loop"]["state"]["step"]), time.perf_counter() - started))

        try:
            self._manager = Manager(
                pg=_quorum_group(self, step_timeout), load_state_dict=load, state_dict=give,
                min_replica_size=self.min_replicas, use_async_quorum=False, timeout=step_timeout,
                quorum_timeout=timedelta(seconds=self.quorum_timeout_s),
                connect_timeout=timedelta(seconds=self.connect_timeout_s), rank=strategy.global_rank,
                world_size=strategy.world_size, store_addr=host, store_port=port, lighthouse_addr=self._address(),
                replica_id=f"group{self.group}", init_sync=False)  # every group builds the same weights from the seed
            if self._resumed is not None:  # its step: a group behind the others' then heals from them
                self._manager.load_state_dict(self._resumed)
        except Exception as err:  # noqa: BLE001 - torchft's Rust client raises plain exceptions
            raise ConfigError(f"fault_tolerance.lighthouse={self.lighthouse}: group {self.group} could not reach the "
                              f"lighthouse at {self._address()} within fault_tolerance.connect_timeout_s="
                              f"{self.connect_timeout_s:g} ({str(err).splitlines()[0]}); start it (`framework "
                              "lighthouse`) or correct the address.") from err

    def _address(self) -> str:
        address = self.lighthouse
        return address if "://" in address else f"http://{address}"

    def begin_step(self) -> bool:
        self._healed_now = False
        start = time.perf_counter()
        manager = self._manager
        manager.start_quorum()  # synchronous: a heal is applied before this returns
        # A run (fresh or resumed) starts with every group: a group's first step, unless it has just
        # healed (then the others are running: it joins them as they are), asks for the quorum again
        # until all groups are in it. The others in that quorum are at their first step too (a
        # running group is ahead, and this one would have healed from it), so they wait alike.
        deadline = start + self.quorum_timeout_s
        while (self._first_step and not self._healed_now and manager.num_participants() < self.replica_groups
               and time.perf_counter() < deadline):
            time.sleep(0.05)
            manager.start_quorum()
        self._new_in_quorum = self._first_step or self._healed_now  # what it holds is compared at this step
        self._first_step = False
        if self._peer_layout is not None:
            raise ConfigError(self._layouts_differ_message(f"the live group it would heal from holds "
                                                           f"{self._peer_layout}"))
        if self._duplicate_id:
            raise ConfigError(f"fault_tolerance.replica_id={self.group}: another group joined the lighthouse with the "
                              "same id (it would read the same share of the data); give each group its own id, 0 to "
                              f"{self.replica_groups - 1}.")
        if self._healed_now:
            self._record.heals[-1].seconds = time.perf_counter() - start
            self._record.heals[-1].at = time.time()
        count = self._manager.num_participants()
        self._record.participants[count] = self._record.participants.get(count, 0) + 1
        return self._healed_now

    def average_gradients(self, parameters, loss: torch.Tensor) -> torch.Tensor:
        """The step's loss and what this rank holds (its layout's code) averaged over the groups
        first, in one small collective: groups whose rank r holds different parts must not average
        their gradients; then the gradients, in one collective for the step."""
        manager = self._manager
        shared = torch.cat([loss.detach().to(torch.float64).reshape(1), self._layout_code.to(loss.device)])
        manager.allreduce(shared).wait()
        if manager.errored() is None and _codes_differ(shared[1:]):
            message = self._layouts_differ_message("another group in this step's quorum holds something else")
            if self._new_in_quorum:  # this group is the one joining (a fresh run's groups all are)
                raise ConfigError(message)
            # a group of another layout joined the running ones: it stops itself (above); this
            # step is not committed without it, and the groups go on
            manager.report_error(RuntimeError(message))
            if self._speaks:
                warn(f"replicas: a group joined whose ranks hold other parts of the model than group {self.group}'s "
                     f"({self._layout.words if self._layout else 'unknown'}); it stops itself, and this step is taken "
                     "again without it")
            return shared[0]
        # this rank's part of each gradient (an fsdp shard: rank r of every group holds the same one)
        grads = [g.to_local() if hasattr(g, "to_local") else g for g in (p.grad for p in parameters) if g is not None]
        if grads:
            flat = torch.cat([g.reshape(-1) for g in grads])  # one collective for the step, not one per tensor
            manager.allreduce(flat).wait()
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        return shared[0]

    def _layouts_differ_message(self, other: str) -> str:
        mine = self._layout.words if self._layout is not None else "an unknown layout"
        return (f"fault_tolerance=torchft: replica group {self.group} holds {mine}, and {other}: rank r of "
                "every group must hold the same part of the model (their gradients are averaged and a heal "
                "copies rank to rank); start every group with the same strategy, devices, num_nodes, precision "
                "and model keys.")

    def commit(self) -> bool:
        committed = self._manager.should_commit()
        if not committed:
            self._record.uncommitted_steps += 1
        return committed

    @property
    def participants(self) -> int:
        return self._manager.num_participants() if self._manager is not None else 1

    @property
    def writes_checkpoints(self) -> bool:
        """The group that is the quorum's first (one live group writes; a healing one never does)."""
        manager = self._manager
        return manager is None or (manager.participating_rank() == 0 and not self._healed_now)

    def state_dict(self) -> dict:
        """The groups' count and torchft's own state (its step and committed batches)."""
        manager = self._manager.state_dict() if self._manager is not None else self._resumed
        return {"replica_groups": self.replica_groups, "manager": manager}

    def load_state_dict(self, state: dict | None) -> None:
        if state is None:  # a checkpoint of a run without replica groups: torchft's step follows the loop's
            return
        if int(state["replica_groups"]) != self.replica_groups:
            raise ConfigError(f"fault_tolerance.replica_groups={self.replica_groups}: the checkpoint was written by "
                              f"{state['replica_groups']} replica groups, whose data shares this run's would not "
                              f"continue; resume with fault_tolerance.replica_groups={state['replica_groups']}, or under "
                              "fault_tolerance=none (plain ddp or fsdp continue its data where it stopped).")
        if self._manager is not None:
            self._manager.load_state_dict(state["manager"])
        else:  # a resume, before the groups are joined
            self._resumed = state["manager"]

    def record(self) -> ReplicaRecord:
        return self._record

    def leave(self) -> None:
        if self._manager is not None:
            self._manager.shutdown(wait=False)
            self._manager = None
            # its process group and threads freed now, while the interpreter is whole: left to the
            # interpreter's exit (after a group's error) their C++ destructors aborted the process once
            # (exit -6, "terminate called without an active exception") instead of its own exit code
            gc.collect()
        self._store = None
