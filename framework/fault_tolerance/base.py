"""The FaultTolerance base class: what the launch, the loader and the loop ask of the option.

`none` (the base itself) is one replica group that is the whole run: every hook does nothing, so
the loop's step is the ordinary one. framework/fault_tolerance/torchft.py overrides them."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass
class Heal:
    """A group's copy of a live peer's state: the step it healed to, how long the quorum and copy
    took, and when it was done (Unix time)."""

    step: int
    seconds: float
    at: float = 0.0


@dataclass
class ReplicaRecord:
    """What a group's summary.json says of it (fault_tolerance=torchft): its id, the heals, the
    steps whose commit failed, and how many of its steps each number of groups took part in."""

    replica_id: int
    heals: list[Heal] = field(default_factory=list)
    uncommitted_steps: int = 0
    participants: dict[int, int] = field(default_factory=dict)
    """{groups taking part: this group's steps with that many}"""


@dataclass(frozen=True)
class GroupLayout:
    """What one rank of a replica group holds: `words` for a message, `digest` of every tensor's
    name, local shape and dtype. Rank r of every group must hold the same (their gradients are
    averaged and a heal copies rank r's state to rank r), so the groups compare digests."""

    words: str
    digest: bytes

    @classmethod
    def of(cls, words: str, tensors: list[tuple[str, tuple[int, ...], str]]) -> GroupLayout:
        text = words + "\n" + "\n".join(f"{name} {list(shape)} {dtype}" for name, shape, dtype in tensors)
        return cls(words, hashlib.sha256(text.encode()).digest())


class FaultTolerance:
    """No fault tolerance: one replica group, the run. A subclass splits the data-parallel dimension
    into `replica_groups` groups, each `devices x num_nodes` processes."""

    name = "none"
    #: groups the data is dealt to (each a data-parallel share of its own)
    replica_groups = 1
    #: this process's group, 0 .. replica_groups - 1
    group = 0
    #: whether it runs replica groups (then a strategy's replica_groups_refusal applies: the
    #: compatibility table reads both)
    forms_groups = False

    @property
    def launches_groups(self) -> bool:
        """Whether this command starts every group itself (and a lighthouse) instead of being one."""
        return False

    def resolve_devices(self, accelerator, devices) -> int:
        """The `devices` key as a count of one group's devices (all of the run's, without groups)."""
        return accelerator.resolve_devices(devices)

    def problems(self) -> list[str]:
        """Problems with this option's own settings (before launch; the strategies it carries are
        the compatibility table's)."""
        return []

    # ---- in every process of a group ------------------------------------------------------
    def join(self, strategy, state_dict, load_state_dict, layout: GroupLayout | None = None) -> None:
        """Join the replica groups; `state_dict()` / `load_state_dict(state)` give and take this
        rank's whole training state (a heal copies it from the same rank of a live peer); `layout`:
        what this rank holds, which must be what the same rank of every other group holds."""

    def begin_step(self) -> bool:
        """Before a step's first forward: agree who takes part. True when this group has just
        copied a live peer's state (its loop must continue from the position that state holds)."""
        return False

    def average_gradients(self, parameters, loss: torch.Tensor) -> torch.Tensor | None:
        """After the step's backward, before clipping: the gradients averaged over the groups that
        take part; returns the step's `loss` averaged over them too (None: no replica groups, the
        loss is this group's alone)."""
        return None

    def commit(self) -> bool:
        """After the gradients are final: whether every taking-part group may step (a vote)."""
        return True

    @property
    def participants(self) -> int:
        """Groups that took part in the current step."""
        return 1

    @property
    def writes_checkpoints(self) -> bool:
        """Whether this group writes the run's periodic checkpoints now (one live, not healing, group does)."""
        return True

    def state_dict(self) -> dict | None:
        """What a checkpoint (and a heal) keeps of the groups' own state; None: nothing."""
        return None

    def load_state_dict(self, state: dict | None) -> None:
        """A checkpoint's (or a live peer's) state_dict; a checkpoint of replica groups resumes
        without them too (this option ignores it)."""

    def record(self) -> ReplicaRecord | None:
        """What summary.json says of this group (None: nothing, no replica groups)."""
        return None

    def leave(self) -> None:
        """Leave the replica groups (the end of the run, or its failure)."""
