"""`checkpoint_io=dcp`: sharded torch.distributed.checkpoint writes, each rank its own shards."""
from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch.distributed as dist

import framework.checkpoint_io.dcp_reader  # noqa: F401  (silences DCP's single-process warning)
from framework.checkpoint_io.dcp_reader import describe, root_cause
from framework.checkpoint_io.staging import KeptBufferStager
from framework.checkpoint_io.torch import TorchCheckpointIO, fsync_dir
from framework.config.types import PositiveInt
from framework.errors import CheckpointError


class DCPCheckpointIO(TorchCheckpointIO):
    """Model and optimizer state go to one DCP directory (`state/` in the checkpoint): every rank
    writes the shards it holds (FSDP's DTensor shards; DDP's replicas are split between the ranks
    so each tensor is written once), and rank zero writes the metadata. Strategies that keep
    their state in their own layout (DeepSpeed, ddp_sharded) hand over full tensors from rank
    zero, which then writes them alone. Small per-rank files (loop state) are written like
    checkpoint_io=torch.

    With `async_save`, the save copies the shards to CPU memory and returns; a background thread
    writes them over a process group of its own (gloo), so its collectives never interleave with
    training's. The loop finalizes the checkpoint at a later step boundary, as with
    checkpoint_io=async. The copy goes into buffers kept from one save to the next
    (framework/checkpoint_io/staging.py)."""

    name = "dcp"
    sharded = True

    def __init__(self, async_save: bool = False, fsync: bool = True, thread_count: PositiveInt = 1,
                 keep_staging_buffers: bool = True):
        """async_save: write in the background after copying the shards off the live parameters.
        fsync: flush every file to disk before the checkpoint is finalized.
        thread_count: threads each rank writes its files with.
        keep_staging_buffers: with async_save, keep the CPU copy's buffers between saves (a save
            then copies into memory already mapped); false frees them after each write, trading
            a slower copy for memory held between saves (the size of this rank's shards)."""
        super().__init__(fsync=fsync)
        self.async_save = async_save
        self.thread_count = thread_count
        self.keep_staging_buffers = keep_staging_buffers
        self._future: Future | None = None
        self._group = None
        self._planner = None  # one save planner for the run: its plans are cached between saves
        self._stager = None  # one stager for the run when its buffers are kept

    @property
    def is_async(self) -> bool:  # type: ignore[override]
        return self.async_save

    def _process_group(self):
        """A gloo group for DCP's own collectives (DCP needs a CPU backend for async saves; a
        separate group keeps a background save from interleaving with training's collectives)."""
        if not (dist.is_available() and dist.is_initialized()):
            return None
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        return self._group

    def save_sharded(self, state: dict[str, Any], path) -> None:
        """Collective: every rank passes the state it holds (its shards, or nothing)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import DefaultSavePlanner, FileSystemWriter
        from torch.distributed.checkpoint.api import CheckpointException

        self.wait()  # one write at a time
        path = Path(path)
        group = self._process_group()
        if self._planner is None:  # a run saves the same structure each time: plan once, reuse
            self._planner = DefaultSavePlanner(enable_plan_caching=True)
        try:
            writer = FileSystemWriter(str(path), sync_files=self.fsync, thread_count=self.thread_count)
            kwargs = {"storage_writer": writer, "planner": self._planner, "process_group": group, "no_dist": group is None}
            if self.async_save:
                response = dcp.async_save(state, async_stager=self._staging(), **kwargs)
                self._future = getattr(response, "upload_completion", response)
                return
            dcp.save(state, **kwargs)
        except (Exception, CheckpointException) as err:
            raise CheckpointError(f"writing the sharded checkpoint {path} failed: {describe(root_cause(err))}") from err
        if self.fsync:
            fsync_dir(path)

    def _staging(self):
        """The stager that copies the shards off the live tensors: kept for the run (its buffers
        are reused), or None to let DCP make and free one per save."""
        if not self.keep_staging_buffers:
            return None
        if self._stager is None:
            self._stager = KeptBufferStager()
        return self._stager

    def close(self) -> None:
        self.wait()
        stager, self._stager = self._stager, None
        if stager is not None:
            stager.close()

    def pending(self) -> bool:
        if self._future is None:
            return False
        return not self._future.done()  # a failed write is done: `wait` raises its error

    def wait(self) -> None:
        future, self._future = self._future, None
        if future is None:
            return
        from torch.distributed.checkpoint.api import CheckpointException

        try:
            future.result()
        except (Exception, CheckpointException) as err:
            raise CheckpointError(f"the background sharded checkpoint write failed: {describe(root_cause(err))}") from err

    def __repr__(self) -> str:
        return (f"DCPCheckpointIO(async_save={self.async_save}, fsync={self.fsync}, thread_count={self.thread_count}, "
                f"keep_staging_buffers={self.keep_staging_buffers})")

