"""The loop's counters: everything besides model, optimizer and RNG that a resume restores."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from framework.loop.nonfinite import Divergence


@dataclass(frozen=True)
class RunMode:
    """What the processes of a run do: fit (train; test at the end with trainer.test_at_end), test
    (score ckpt_path on the test split) or predict (write one row per sample of `split`)."""

    name: str = "fit"
    split: str = "test"
    """predict: the data split whose samples get a row."""


class StepOutcome(Enum):
    """What became of one optimizer step: what the loop's step returns, and all the loop acts on."""

    TAKEN = "taken"
    """The optimizer stepped."""
    SKIPPED = "skipped"
    """Counted, without an update: the non-finite guard left it out, or the loss scaler skipped it."""
    DROPPED = "dropped"
    """Replica groups: not committed (a group failed during it); its batches untrained, taken again
    with the next ones."""
    HEALED = "healed"
    """Replica groups: before it started, this group copied a live peer's state (its step and data
    position); the epoch's batches go on from there."""


@dataclass(frozen=True)
class Preemption:
    """The run stopped for a signal after saving a checkpoint at `step`."""

    signal: str  # e.g. "SIGTERM", or "a signal on another rank"
    step: int


@dataclass
class FitResult:
    """What a training process returns (to the launcher, across processes: plain and picklable)."""

    metrics: dict[str, float]
    preempted: Preemption | None = None
    diverged: Divergence | None = None
    """Set when the run stopped for non-finite numbers (trainer.on_nonfinite)."""
    tested: dict | None = None
    """What `trainer.test_at_end` (or `framework test`) scored: checkpoint, step, why it was
    chosen, and the test metrics."""
    replicas: dict | None = None
    """fault_tolerance=torchft: this group's id, heals, final step and weights' digest (summary.json)."""


@dataclass
class LoopState:
    step: int = 0
    """Optimizer steps taken."""
    epoch: int = 0
    """Completed passes over the training data."""
    batch_in_epoch: int = 0
    """Micro-batches consumed in the current epoch."""
    should_stop: bool = False
    """Set by a callback (early stopping) to end the run after this step."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The latest value of every logged metric."""
    metric_steps: dict[str, int] = field(default_factory=dict)
    """The step at which each metric was last logged."""
    last_val_step: int | None = None
    """The step of the latest validation."""
    items_seen: int = 0
    """Training items (tokens or samples: the task's throughput unit) consumed by all ranks, up
    to the latest logged step."""

    def fresh_metrics(self) -> dict[str, float]:
        """Metrics logged at the current step."""
        return {k: v for k, v in self.metrics.items() if self.metric_steps.get(k) == self.step}

    def state_dict(self) -> dict:
        return {"step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                "should_stop": self.should_stop, "metrics": dict(self.metrics),
                "metric_steps": dict(self.metric_steps), "last_val_step": self.last_val_step,
                "items_seen": self.items_seen}

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)
