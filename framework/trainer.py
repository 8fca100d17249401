"""Trainer assembly: what every process of a run runs. Builds the plugins, data, model, task,
optimizer, scheduler, loaders, callbacks and loggers from the resolved config, hands them to the
loop, and returns the loop's typed result (metrics, or where it was preempted).

Three modes (framework/loop/state.py RunMode): `fit` (train; with trainer.test_at_end, then test
the best checkpoint), `test` (score the checkpoint `ckpt_path` names on the data's test split:
`framework test`) and `predict` (one row per sample of a split, written per rank: `framework
predict`)."""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch
from omegaconf import OmegaConf

from framework.callbacks.progress import RichProgress, TextProgress
from framework.checkpoint.load import load_model_weights
from framework.checkpoint.resume import resume_path
from framework.checkpoint.rng import rng_state, seed_everything
from framework.checkpoint.weights import initial_weights
from framework.config.build import build, guarded
from framework.config.loop_settings import loop_settings
from framework.console import WarningsOnce, announce_if_slow
from framework.data.loaders import build_loader
from framework.data.once import prepare_once
from framework.errors import ConfigError
from framework.loop.evaluation import predict, score
from framework.loop.fit_loop import FitLoop
from framework.loop.parts import Loaders, RunContext, Training
from framework.loop.preemption import PreemptionWatcher
from framework.loop.state import FitResult, RunMode
from framework.models.build import build_model
from framework.plugins import build_plugins
from framework.tasks.base import without_dropout
from framework.tasks.decay import decay_groups
from framework.tasks.frozen import build_frozen, handed_over
from framework.tasks.manual import ManualOptimization, optimizer_set_factory
from framework.tensors import weights_digest

SCHEDULER_INTERVALS = ("step", "epoch")


def total_optimizer_steps(trainer, batches_per_epoch: int) -> int:
    """The run's length in optimizer steps, from max_steps and/or max_epochs."""
    per_epoch = math.ceil(batches_per_epoch / trainer.accumulate)
    candidates = [trainer.max_steps] if trainer.max_steps is not None else []
    if trainer.max_epochs is not None:
        candidates.append(trainer.max_epochs * per_epoch)
    return min(candidates)


def build_scheduler(node, optimizer, total_steps: int):
    """The scheduler and its interval. A `total_steps: null` argument means the run's length."""
    if node is None:
        return None, "step"
    node = OmegaConf.create(OmegaConf.to_container(node))
    if "total_steps" in node and node.total_steps is None:
        node.total_steps = total_steps
    interval = node.pop("interval", "step")
    if interval not in SCHEDULER_INTERVALS:
        raise ConfigError(f"scheduler.interval={interval!r}: must be one of {', '.join(SCHEDULER_INTERVALS)}.")
    return guarded(build(node, "scheduler"), "scheduler")(optimizer), interval


def configure_determinism(deterministic: bool) -> bool:
    """Apply trainer.deterministic; returns the previous setting, restored when the run ends."""
    previous = torch.are_deterministic_algorithms_enabled()
    if deterministic and not previous:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # required by cuBLAS
        # only when it changes: the call imports torch._inductor (over a second of start-up)
        torch.use_deterministic_algorithms(True)
    return previous


def train_worker(config: dict, output_dir: str, mode: RunMode = RunMode()) -> FitResult:
    """Entry of every process of a run. `config` is the resolved config as plain containers
    (picklable: workers never re-read sys.argv or Hydra state); `mode` what to do (MODES).
    Returns the loop's result."""
    cfg = OmegaConf.create(config)
    plugins = build_plugins(cfg)
    strategy = plugins.strategy
    strategy.setup_environment()
    warnings_once = WarningsOnce(strategy.global_rank, debug=bool(cfg.get("debug", False)))
    was_deterministic = configure_determinism(cfg.trainer.deterministic)
    try:
        # Everything that holds the wrapped model lives inside _fit, so it is freed when _fit
        # returns, before the strategy's teardown destroys its process group (ParallelStrategy
        # collects what cycles still hold first).
        return MODES[mode.name](cfg, config, plugins, Path(output_dir), mode)
    finally:
        strategy.teardown()
        if torch.are_deterministic_algorithms_enabled() != was_deterministic:
            torch.use_deterministic_algorithms(was_deterministic)
        warnings_once.restore()


def trainable_only(factory):
    """An optimizer factory given only the parameters that train."""
    return lambda params, *args, **kwargs: factory([p for p in params if p.requires_grad], *args, **kwargs)


def fitted_to_precision(factory, precision, talk: bool):
    """An optimizer factory whose optimizer the precision adjusts to its dtype (said once)."""
    def build_optimizer(*args, **kwargs):
        optimizer = factory(*args, **kwargs)
        note = precision.prepare_optimizer(optimizer)
        if note and talk:
            print(note, flush=True)
        return optimizer

    return build_optimizer


def _model_and_optimizer(cfg, strategy, task, pretrained: bool = True):
    """The model built and set up by the strategy with its optimizer (an engine such as DeepSpeed
    wraps both at once); `pretrained`: copy the weights a model built without them names."""
    optimizer_factory = guarded(build(cfg.optimizer, "optimizer"), "optimizer")
    strategy.configure_loop(loop_settings(cfg))
    talk = strategy.is_global_zero
    model_name = cfg.model._target_.rsplit(".", 1)[-1]
    adapter = build(cfg.adapter, "adapter") if cfg.get("adapter") else None
    frozen = task.frozen_source()
    built_from = rng_state() if frozen is not None else None  # a second model is built from the same random state
    with announce_if_slow(f"building the model ({model_name})", talk, why=strategy.setup_note):
        model = strategy.build_model(lambda: build_model(cfg.model), adapter)
    if task.disable_dropout:
        without_dropout(model)
    if not cfg.trainer.decay_biases_and_norms:  # transformers' rule: biases and norms without weight decay
        optimizer_factory = decay_groups(optimizer_factory, model)
    if adapter is not None:  # the optimizer holds the adapters' weights alone
        optimizer_factory = trainable_only(optimizer_factory)
    if not task.automatic_optimization:  # one optimizer per named group of the task
        optimizer_factory = optimizer_set_factory(task, model, optimizer_factory)
    optimizer_factory = fitted_to_precision(optimizer_factory, strategy.precision, talk)
    with announce_if_slow(f"{strategy.name}: setting up the model and optimizer", talk, why=strategy.setup_note):
        model, optimizer = strategy.setup(model, optimizer_factory)
    weights = getattr(strategy.unwrap(model), "pretrained_weights", None) if pretrained else None
    if weights:  # named by a model built without weights (a sharded build): each rank copies its part
        with announce_if_slow(f"loading pretrained weights ({Path(weights[0]).parent})", talk):
            strategy.load_model_state_dict(model, initial_weights(strategy.unwrap(model), weights))
    if frozen is not None:  # the second model, handed over once (framework/tasks/second_model.py)
        with announce_if_slow(f"building the frozen model of {frozen.key}", talk):
            task.use_frozen(handed_over(frozen, adapter, lambda: build_frozen(frozen, cfg, strategy, built_from)))
    return model, optimizer


def _fit(cfg, config: dict, plugins, output_dir: Path, mode: RunMode) -> FitResult:
    strategy = plugins.strategy
    seed_everything(cfg.seed)
    datamodule = build(cfg.data, "data")
    task = build(cfg.task, "task")
    callbacks = {name: build(node, f"callbacks.{name}") for name, node in cfg.callbacks.items()}
    talk = strategy.is_global_zero
    model, optimizer = _model_and_optimizer(cfg, strategy, task)
    manual = None
    if not task.automatic_optimization:
        manual = ManualOptimization(strategy, model, optimizer, cfg.trainer.clip_grad_norm, cfg.trainer.clip_grad_value)
    with announce_if_slow(f"preparing the data ({cfg.data._target_.rsplit('.', 1)[-1]})", talk):
        prepare_once(datamodule, strategy)
        train_loader = build_loader(datamodule, strategy, "train", seed=cfg.seed)
    scheduler, interval = build_scheduler(cfg.scheduler, optimizer,
                                          total_optimizer_steps(cfg.trainer, len(train_loader)))
    val_loader = build_loader(datamodule, strategy, "val", seed=cfg.seed, limit_batches=cfg.trainer.val_batches)
    test_loader = build_loader(datamodule, strategy, "test", seed=cfg.seed, limit_batches=cfg.trainer.test_batches) \
        if cfg.trainer.test_at_end else None

    loggers = []
    if strategy.is_global_zero:
        loggers = [build(node, f"logger.{name}", save_dir=str(output_dir)) for name, node in cfg.logger.items()]
        for logger in loggers:
            logger.log_hyperparams(config)
        bar = cfg.trainer.progress_bar and sys.stdout.isatty()
        callbacks["progress"] = RichProgress() if bar else TextProgress()
    data_identity = (datamodule.fingerprint(), bool(getattr(datamodule, "allow_changed", False)))
    run_meta = {"strategy": strategy.name, "precision": plugins.precision.name,
                "accelerator": plugins.accelerator.name, "checkpoint_io": strategy.checkpoint_io.name, "config": config}
    signals = list(dict.fromkeys([*cfg.trainer.preemption_signals, *plugins.cluster.preemption_signals()]))
    preemption = PreemptionWatcher(signals)
    replicas = plugins.fault_tolerance
    loop = FitLoop(Training(strategy, task, model, optimizer, scheduler, interval, manual, replicas),
                   Loaders(train_loader, val_loader, test_loader), cfg.trainer,
                   RunContext(output_dir, run_meta, callbacks, loggers, preemption, *data_identity))
    try:
        result = loop.fit(resume_path(cfg, output_dir, loop.say, restarted=plugins.cluster.restarted))
        record = replicas.record()
        if record is not None:  # what summary.json says of the group: a user compares the digests
            whole = strategy.model_state_dict(model)  # collective: the whole weights, on the group's rank zero
            result.replicas = {**asdict(record), "final_step": loop.state.step, "weights_sha256": weights_digest(whole)}
        return result
    finally:
        replicas.leave()
        preemption.restore()


def _trained(cfg, plugins, split: str):
    """(task, model with the weights of ckpt_path, loader of `split`, the checkpoint's meta):
    weights only (no optimizer state, loop or RNG of the run), set up by this config's strategy
    at this world size."""
    strategy = plugins.strategy
    seed_everything(cfg.seed)
    datamodule = build(cfg.data, "data")
    task = build(cfg.task, "task")
    talk = strategy.is_global_zero
    # the checkpoint holds every weight, unless it is an adapter's: then the frozen ones come from the model's own
    model, _ = _model_and_optimizer(cfg, strategy, task, pretrained=bool(cfg.get("adapter")))
    with announce_if_slow(f"loading the weights of {cfg.ckpt_path}", talk):
        meta = load_model_weights(strategy, model, Path(cfg.ckpt_path))
    with announce_if_slow(f"preparing the data ({cfg.data._target_.rsplit('.', 1)[-1]})", talk):
        prepare_once(datamodule, strategy)
        limit = cfg.trainer.test_batches if split == "test" else cfg.trainer.val_batches if split == "val" else None
        loader = build_loader(datamodule, strategy, split, seed=cfg.seed, limit_batches=limit, training=False)
    return task, model, loader, meta


def _test(cfg, config: dict, plugins, output_dir: Path, mode: RunMode) -> FitResult:
    """Score the checkpoint `ckpt_path` names on the test split."""
    task, model, loader, meta = _trained(cfg, plugins, "test")
    metrics = score(plugins.strategy, task, model, loader, "test")
    return FitResult(metrics, tested={"checkpoint": str(cfg.ckpt_path), "step": (meta or {}).get("step"),
                                      "chosen": "given", "metrics": metrics})


def _predict(cfg, config: dict, plugins, output_dir: Path, mode: RunMode) -> FitResult:
    """One row per sample of `mode.split` with what the task predicts, written by each rank to
    output_dir/<PREDICTION_PARTS>-rank<r>.jsonl (the launching process merges them in order)."""
    strategy = plugins.strategy
    task, model, loader, _ = _trained(cfg, plugins, mode.split)
    path = output_dir / f"{PREDICTION_PARTS}-rank{strategy.global_rank}.jsonl"
    rows = 0
    with open(path, "w", encoding="utf-8") as out:
        for index, row in predict(strategy, model, loader, task.predict_step):
            if strategy.data_parallel.reports:  # a tensor-parallel rank's group has one rank write its rows
                out.write(json.dumps({"index": index, **row}) + "\n")
                rows += 1
    strategy.barrier()  # every rank's file is complete before rank zero's process merges them
    return FitResult({"rows": float(rows)})


# What a process runs in each mode of a run.
MODES = {"fit": _fit, "test": _test, "predict": _predict}
PREDICTION_PARTS = "predictions"
