"""The structured schema of `conf/train.yaml`, registered with Hydra's ConfigStore.

Hydra merges every YAML and override into these dataclasses, so an unknown key or a value of the
wrong type is rejected while the config is composed, naming the key. The plugin groups are
`_target_` nodes whose arguments are checked against the target's signature by
`framework.config.targets` (one schema per class, written once, in the class itself).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

NONFINITE_POLICIES = ("stop", "skip", "warn")  # trainer.on_nonfinite (framework/loop/nonfinite.py)


@dataclass
class TrainerConfig:
    """How long to train and how the loop behaves. The defaults are those of conf/trainer/default.yaml
    (tests/config/test_schema_defaults.py keeps the two equal); docs/reference/config.md lists them."""

    max_steps: Optional[int] = 300
    """Stop after this many optimizer steps; null for no limit (then max_epochs must be set)."""
    max_epochs: Optional[int] = None
    """Stop after this many passes over the training data; null for no limit."""
    val_every: int = 100
    """Validate every N optimizer steps (and always once at the end)."""
    val_at_start: bool = True
    """Validate once before the first step, so logs show where training started."""
    val_batches: Optional[int] = 10
    """Score at most this many batches of data.val_batch_size per validation, counted over all ranks
    (the first val_batches x val_batch_size samples, shared between the ranks), so a metric does not
    depend on the number of processes; null for the whole validation set."""
    test_at_end: bool = False
    """When fit ends, score the data's test split with the best checkpoint's weights (by
    callbacks.checkpoint.monitor; the newest checkpoint without one, the final weights without a
    checkpoint callback): test/<metric> in the logs, summary.json and test_metrics.json, and
    usable as the objective. `framework test RUN_DIR` does the same for a finished run."""
    test_batches: Optional[int] = None
    """Score at most this many batches of data.val_batch_size of the test split, counted over all
    ranks like val_batches; null for the whole test split."""
    accumulate: int = 1
    """Gradient accumulation: micro-batches per optimizer step."""
    clip_grad_norm: Optional[float] = 1.0
    """Clip the global gradient norm to this value (after unscaling); null for no clipping."""
    clip_grad_value: Optional[float] = None
    """Clamp every gradient element to [-v, v]; null for no clipping."""
    decay_biases_and_norms: bool = False
    """Apply the optimizer's weight_decay to biases and normalisation weights too (every parameter,
    as torch.optim.AdamW(model.parameters()) does). false: they are left out (a second parameter
    group with weight_decay 0), transformers' Trainer's rule and so trl's and nanoGPT's
    (framework/tasks/decay.py says which parameters). A checkpoint resumes across the two."""
    log_every: int = 20
    """Log training metrics (and print them when there is no progress bar) every N steps."""
    peak_tflops: Optional[float] = None
    """The accelerator's peak dense TFLOP/s per device in the run's compute dtype, for train/mfu
    (model-FLOPs utilisation) where framework/accelerator/peak_flops.py does not know the device (a
    CPU, a GPU not in its table); null: the table's figure, or no train/mfu."""
    deterministic: bool = False
    """Use only deterministic algorithms (torch.use_deterministic_algorithms)."""
    progress_bar: bool = True
    """Show a live progress bar with loss and throughput (only ever on a terminal, rank zero)."""
    preemption_signals: List[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1"])
    """Signals that make the run save at the next step boundary and exit with code 75 (requeue)."""
    activation_checkpointing: bool = False
    """Recompute each sharding unit's activations in backward instead of keeping them (less
    memory, about one more forward); the units are the strategy's (framework/construction/units.py)."""
    compile: bool = False
    """torch.compile the model in place: whole (one graph, as torch.compile(model)) under
    single_device and ddp, each unit (the transformer blocks) under the sharding strategies and with
    activation checkpointing, whose hooks sit between units (framework/construction/compile.py).
    Faster steady steps after a slower first one (said at start); refused with the strategies and
    precisions that cannot take it (the compatibility table says which)."""
    on_nonfinite: str = "stop"
    """What a step whose loss or gradient norm is NaN or infinite does: 'stop' ends the run at once
    (exit code 3; no checkpoint of non-finite weights is written, the finite ones are kept, summary.json
    says why), 'skip' leaves that optimizer step out (one host read of the gradient norm per step),
    'warn' says so once and trains on (its non-finite checkpoints are marked and never rotate the
    last finite one away). Ranks of a multi-process run agree where they already meet: logging,
    validation, checkpoints."""
    nonfinite_skip_limit: int = 25
    """Stop when this many optimizer steps in a row were skipped, by on_nonfinite=skip or by fp16's
    loss scaler (which skips steps whose gradients overflowed): a run that skips every step is not
    training. 0: no limit."""
    max_restarts: int = 0
    """Restart the worker group this many times after a worker dies (multi-process runs)."""
    objective: str = "val/loss"
    """The metric `run` returns (for Hydra sweepers); its last logged value."""
    objective_mode: str = "min"
    """'min' or 'max': which way the objective is better (a sweep's summary lists the best first)."""
    plot: bool = True
    """When the run ends, draw its curves to metrics.png in the run directory (a sweep: sweep.png
    and curves.png in the sweep's); needs matplotlib (`pip install 'framework[plot]'`), skipped
    without it. `framework plot` draws the same figures at any time."""


@dataclass
class TrainConfig:
    """The root of the config tree (`conf/train.yaml`)."""

    accelerator: Any = MISSING
    """Device type and placement (conf/accelerator)."""
    strategy: Any = MISSING
    """How the model is wrapped and processes communicate (conf/strategy)."""
    precision: Any = MISSING
    """Autocast, loss scaling, clipping and dtype conversion (conf/precision)."""
    checkpoint_io: Any = MISSING
    """How checkpoint bytes reach storage (conf/checkpoint_io)."""
    cluster: Any = MISSING
    """Where ranks and the main address come from (conf/cluster)."""
    fault_tolerance: Any = MISSING
    """Replica groups that go on without a dead peer and heal from a live one (conf/fault_tolerance)."""
    model: Any = MISSING
    """The nn.Module to train (conf/model)."""
    data: Any = MISSING
    """Datasets and loader settings (conf/data)."""
    task: Any = MISSING
    """How a batch becomes a loss and metrics (conf/task)."""
    optimizer: Any = MISSING
    """A partial optimizer: called with the model's parameters (conf/optimizer)."""
    scheduler: Any = None
    """A partial LR scheduler (called with the optimizer) plus `interval: step|epoch`; null for none."""
    logger: Dict[str, Any] = field(default_factory=dict)
    """Metric loggers by name (conf/logger; choose several with logger=[csv,tensorboard])."""
    callbacks: Dict[str, Any] = field(default_factory=dict)
    """Callbacks by name (conf/callbacks; choose several with callbacks=[checkpoint,lr_monitor])."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Loop settings."""
    adapter: Any = None
    """Trainable adapters on a frozen model (conf/adapter, e.g. lora); null: train every weight."""
    devices: Any = 1
    """Devices (processes) per node: a positive integer or 'auto'."""
    num_nodes: int = 1
    """Number of machines."""
    seed: int = 1234
    """Seed for Python, NumPy and torch; every run with the same seed and config is repeatable."""
    ckpt_path: Optional[str] = None
    """Resume from this checkpoint directory, or start from plain weights: a .safetensors file or a
    torch state_dict file (.pt/.pth/.bin), weights only, mapped so each rank copies only its shards."""
    resume: Optional[str] = None
    """'auto': resume from the newest complete checkpoint in the run directory; null: start fresh."""
    name: str = MISSING
    """Run name; the run directory is outputs/<name>. Give one to make a run resumable by name."""
    debug: bool = False
    """Show full tracebacks for user errors."""
    trust: Any = None
    """Never set: a recipe cannot extend the trusted targets. Allow a prefix with trust.allow=[...]
    on the command line, FRAMEWORK_TRUST_ALLOW, or ~/.config/framework/trust.yaml (framework/config/trust.py)."""


def register() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


register()
