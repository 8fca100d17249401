"""What the training loop is given, in three objects instead of seventeen keywords: what it trains
(`Training`), what it reads (`Loaders`), and where the run reports and keeps its files
(`RunContext`). framework/trainer.py assembles them from the resolved config."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Training:
    strategy: object
    task: object
    model: object
    optimizer: object
    scheduler: object = None
    scheduler_interval: str = "step"
    """When the scheduler steps: every optimizer step, or every epoch."""
    manual: object = None
    """A ManualOptimization when the task steps its optimizers itself (framework/tasks/manual.py)."""
    replicas: object = None
    """The fault_tolerance option (framework/fault_tolerance): the replica groups a step is agreed with."""


@dataclass
class Loaders:
    train: object
    val: object
    test: object = None
    """Given when trainer.test_at_end: the best checkpoint is tested after fit."""


@dataclass
class RunContext:
    output_dir: Path
    run_meta: dict = field(default_factory=dict)
    """What every checkpoint's meta.json holds of the run (strategy, world, versions, config)."""
    callbacks: dict = field(default_factory=dict)
    loggers: list = field(default_factory=list)
    preemption: object = None
    """The PreemptionWatcher (framework/loop/preemption.py), or None: no signals watched."""
    data_fingerprint: str | None = None
    """The training data's identity: a resume on other data is refused ..."""
    allow_changed_data: bool = False
    """... unless data.allow_changed=true."""
