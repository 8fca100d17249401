"""The training loop: steps, accumulation, validation, callbacks, logging, checkpoints.

It talks to the strategy alone for anything device-, precision- or process-specific.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace

import torch
from omegaconf import DictConfig, OmegaConf

from framework.adapter.lora import is_adapted, trainable_names
from framework.callbacks.checkpoint import ModelCheckpoint
from framework.checkpoint.format import (begin_checkpoint, finalize_checkpoint, is_sharded, load_checkpoint_files,
                                         newest_finite)
from framework.checkpoint.load import checkpoint_to_evaluate, load_model_weights
from framework.checkpoint.rng import rng_state, set_rng_state
from framework.checkpoint.weights import fit_saved_state, is_weights_file, load_error_summary
from framework.checkpoint_io.dcp_reader import STATE_DIR
from framework.console import announce_if_slow, human_bytes
from framework.data.loaders import batches_yielded
from framework.errors import CheckpointError, ConfigError
from framework.loop.evaluation import score
from framework.loop.nonfinite import Divergence, NonFiniteGuard, weights_finite
from framework.loop.state import FitResult, LoopState, Preemption
from framework.tasks.base import sums_normalised


class _NonFinite(Exception):
    """Inside the loop: the guard decided to stop (trainer.on_nonfinite); fit() ends the run."""

    def __init__(self, what: str, step: int | None, detail: str = ""):
        super().__init__(what)
        self.what, self.step, self.detail = what, step, detail


class FitLoop:
    def __init__(self, *, strategy, task, model, optimizer, scheduler, scheduler_interval: str,
                 train_loader, val_loader, trainer, callbacks: dict, loggers: list, output_dir: Path,
                 run_meta: dict, preemption=None, manual=None, test_loader=None,
                 data_identity: tuple[str | None, bool] = (None, False)):
        self.strategy = strategy
        self.manual = manual  # a ManualOptimization when the task steps its optimizers itself
        self.task = task
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scheduler_interval = scheduler_interval
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.test_loader = test_loader  # given when trainer.test_at_end: the best checkpoint is tested after fit
        module = strategy.unwrap(model)
        self._adapter_weights = trainable_names(module) if is_adapted(module) else None
        # Read on every step: plain attributes, not OmegaConf nodes (each node access costs
        # tens of microseconds, which a tiny model's step notices).
        self.trainer = _plain(trainer)
        self.callbacks = callbacks
        self.loggers = loggers
        self.output_dir = Path(output_dir)
        self.checkpoint_dir = self.output_dir / "checkpoints"
        self.run_meta = run_meta
        self.state = LoopState()
        self._pending_checkpoint = None
        self.preemption = preemption
        self.preempted_by: str | None = None
        self._resume_sample = 0  # where in its epoch's order the first epoch after a resume starts
        # (the training data's fingerprint, whether a resume may continue on other data: data.allow_changed)
        self.data_fingerprint, self.allow_changed_data = data_identity
        self._first_step_at: float | None = None  # trainer.compile: when the run's first step began
        self._window = {"loss": torch.zeros((), dtype=torch.float64, device=strategy.root_device),
                        "values": {}, "batches": 0, "items": 0, "start": time.perf_counter()}
        # this optimizer step's micro-batches, added to the window once the step is taken (a step
        # the skip policy leaves out is left out of the logged loss too)
        self._step = {"loss": torch.zeros((), dtype=torch.float64, device=strategy.root_device),
                      "batches": 0, "items": 0}
        self._normalised = sums_normalised(task)  # the loss over the step's scored items (framework/tasks/base.py)
        self.guard = NonFiniteGuard(self.trainer.on_nonfinite, self.trainer.nonfinite_skip_limit,
                                    strategy.root_device, distributed=strategy.world_size > 1,
                                    scaled=strategy.precision.loss_scale is not None)

    # ---- public surface for callbacks --------------------------------------------------
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Record metrics at the current step (or at `step`: a checkpoint's test scores belong to the
        step it saved) and send them to the loggers (rank zero only)."""
        step = self.state.step if step is None else step
        self.state.metrics.update(metrics)
        self.state.metric_steps.update({k: step for k in metrics})
        for logger in self.loggers:
            logger.log_metrics(metrics, step)
        self._hook("on_metrics", metrics)

    def say(self, message: str) -> None:
        if self.strategy.is_global_zero:
            print(message, flush=True)

    def _hook(self, name: str, *args) -> None:
        for callback in self.callbacks.values():
            getattr(callback, name)(self, *args)

    # ---- fit ----------------------------------------------------------------------------
    def fit(self, resume_from: Path | None = None) -> FitResult:
        if len(self.train_loader) == 0:
            raise ConfigError("data: the training set gives no batches at this batch size and world size; "
                              "lower data.batch_size or set data.drop_last=false.")
        if resume_from is not None:
            self.restore(resume_from)
        self.model.train()
        self._hook("on_fit_start")
        try:
            if self.trainer.val_at_start and self.state.step == 0:
                self.validate()
            while not self._done():
                self._run_epoch()
        except _NonFinite as stop:
            return self._stopped_nonfinite(stop)
        if self.preempted_by is not None:
            self._finalize_checkpoint(wait=True)
            return FitResult(dict(self.state.metrics), Preemption(self.preempted_by, self.state.step))
        try:
            if self._window["batches"]:  # the steps since the last log (all of them in a run shorter than log_every)
                self._log_train(None, True)
            if self.state.last_val_step != self.state.step:
                self.validate()
            self._hook("on_fit_end")
        except _NonFinite as stop:
            return self._stopped_nonfinite(stop)
        self._finalize_checkpoint(wait=True)
        tested = self.test_best() if self.test_loader is not None else None
        for logger in self.loggers:
            logger.finalize()
        return FitResult(dict(self.state.metrics), tested=tested)

    def _done(self) -> bool:
        t, s = self.trainer, self.state
        return (s.should_stop or self.preempted_by is not None or (t.max_steps is not None and s.step >= t.max_steps)
                or (t.max_epochs is not None and s.epoch >= t.max_epochs))

    def _run_epoch(self) -> None:
        strategy, k = self.strategy, self.trainer.accumulate
        self.train_loader.sampler.set_epoch(self.state.epoch, self._resume_sample)
        self._resume_sample = 0
        n = len(self.train_loader)
        pending: list = []  # this step's micro-batches, when they are counted before any forward
        for batch in self.train_loader:
            if self.trainer.compile and self._first_step_at is None:
                self._first_step_at = time.perf_counter()
            if self.manual is not None:
                self._manual_step(strategy.batch_to_device(batch))
                if self._done():
                    return
                continue
            index = self.state.batch_in_epoch + len(pending)
            group = min(k, n - (index - index % k))  # the last group of an epoch may be short
            pending.append(batch)
            if self._normalised and len(pending) < group:
                continue
            scale = self._step_scale(pending) if self._normalised else None
            for batch in pending:
                self._micro_batch(batch, group, scale)
            pending = []
            if self._ends_step(self.state.batch_in_epoch):
                self._optimizer_step()
                if self._done():
                    return
        self.state.epoch += 1
        self.state.batch_in_epoch = 0
        if self.scheduler is not None and self.scheduler_interval == "epoch":
            self.scheduler.step()
        self._hook("on_epoch_end")

    def _micro_batch(self, batch, group: int, scale: float | None) -> None:
        """Forward and backward of one micro-batch of a step of `group`. With `scale` (a task whose
        loss is normalised by the step's scored items) its summed loss times scale; else its loss
        over the group."""
        strategy = self.strategy
        batch = strategy.batch_to_device(batch)
        with strategy.no_backward_sync(self.model, skip=not self._ends_step(self.state.batch_in_epoch + 1)):
            with strategy.forward_context():
                if scale is None:
                    loss = self._loss_of(self.task.training_step(self.model, batch))
                    logged = loss
                else:
                    loss = self.task.training_sums(self.model, batch)[0] * scale
                    logged = loss * group  # a micro-batch's share, as a mean over the step (logging)
            strategy.backward(loss / group if scale is None else loss)
        self.guard.observe_loss(loss)
        self._step["loss"] += logged.detach().double()
        self._step["batches"] += 1
        self._step["items"] += self.task.batch_size(batch)
        self.state.batch_in_epoch += 1

    def _ends_step(self, batches_done: int) -> bool:
        """Whether the epoch's `batches_done`-th micro-batch is its step's last (every trainer.accumulate,
        and the epoch's last: its final group may be short)."""
        return batches_done % self.trainer.accumulate == 0 or batches_done == len(self.train_loader)

    def _step_scale(self, batches: list) -> float:
        """Data-parallel ranks / the items the step scores on all of them (one all-reduce): each
        rank's summed loss times this has, averaged over the ranks as gradients are, the gradient of
        the step's mean over every scored item."""
        strategy, share = self.strategy, self.strategy.data_parallel
        count = torch.tensor(float(sum(self.task.scored_count(b) for b in batches)), dtype=torch.float64,
                             device=strategy.root_device)
        total = strategy.reduce(count, "sum").item() * share.size / strategy.world_size  # a tensor-parallel group counts once
        return share.size / max(total, 1.0)

    def _loss_of(self, returned) -> torch.Tensor:
        """The loss a training_step returned: a tensor, or a dict holding `loss` whose other
        values are logged as train/<key> (means over the logging interval, like the loss)."""
        if not isinstance(returned, Mapping):
            return returned
        if "loss" not in returned:
            raise ConfigError(f"task: {type(self.task).__name__}.training_step returned a dict without 'loss' (it has "
                              f"{', '.join(returned) or 'nothing'}); return the loss, or a dict with 'loss' and "
                              "other values to log.")
        self._accumulate_values({k: v for k, v in returned.items() if k != "loss"})
        return returned["loss"]

    def _accumulate_values(self, values: Mapping) -> None:
        sums = self._window["values"]
        for key, value in values.items():
            value = torch.as_tensor(value).detach().double().to(self.strategy.root_device)
            sums[key] = sums[key] + value if key in sums else value

    def _manual_step(self, batch) -> None:
        """One batch of a manual-optimization task: it backpropagates and steps its optimizers
        itself (through self.manual), and returns the values to log."""
        self.manual.grad_norms.clear()
        self.manual.skipped.clear()
        with self.strategy.forward_context():
            values = self.task.training_step(self.model, batch, self.manual)
        if not isinstance(values, dict):
            raise ConfigError(f"task: {type(self.task).__name__}.training_step (manual optimization) must return a "
                              f"dict of scalar tensors to log, not {type(values).__name__}.")
        self._accumulate_values(values)
        for value in values.values():
            self.guard.observe_loss(torch.as_tensor(value).to(self.strategy.root_device))
        self._window["batches"] += 1
        self._window["items"] += self.task.batch_size(batch)
        self.state.batch_in_epoch += 1
        norm = max(self.manual.grad_norms.values()) if self.manual.grad_norms else None
        self._step_done(norm, stepped=not self.manual.skipped)

    def _optimizer_step(self) -> None:
        strategy, t, guard = self.strategy, self.trainer, self.guard
        max_norm = t.clip_grad_norm
        if max_norm is None and guard.policy == "skip" and not guard.scaled:
            max_norm = float("inf")  # the norm the skip policy reads, computed the strategy's way; clips nothing
        grad_norm = strategy.clip_gradients(self.model, self.optimizer, max_norm, t.clip_grad_value)
        left_out = guard.skips_step(grad_norm)
        stepped = False if left_out else strategy.optimizer_step(self.optimizer)
        strategy.zero_grad(self.optimizer)
        step = self._step
        if not left_out:
            self._window["loss"] += step["loss"]
            self._window["batches"] += step["batches"]
            self._window["items"] += step["items"]
        step["loss"].zero_()
        step["batches"] = step["items"] = 0
        self._step_done(grad_norm, stepped)

    def _step_done(self, grad_norm, stepped: bool) -> None:
        t = self.trainer
        if self.scheduler is not None and self.scheduler_interval == "step":
            self.scheduler.step()
        self.guard.observe_gradients(self.state.step + 1, grad_norm, stepped)
        self.state.step += 1
        if self._first_step_at is not None and self._first_step_at > 0:  # trainer.compile: said once
            self.say(f"compile: the first step took {time.perf_counter() - self._first_step_at:.1f} s, compiling "
                     "its forward and backward included")
            self._first_step_at = 0.0
        self._check_nonfinite()
        self._finalize_checkpoint_if_written()
        if self.state.step % t.log_every == 0:
            self._log_train(grad_norm, stepped)
        if self.state.step % t.val_every == 0 or self._last_step():
            self.validate()  # the run's last step validates here: before a checkpoint hook saves that step
        self._hook("on_train_step_end")
        self._check_preemption()

    def _last_step(self) -> bool:
        """Whether the step just taken is the run's last by its length (trainer.max_steps, or the
        last batch of the last of trainer.max_epochs)."""
        t, s = self.trainer, self.state
        return ((t.max_steps is not None and s.step >= t.max_steps)
                or (t.max_epochs is not None and s.epoch + 1 >= t.max_epochs
                    and s.batch_in_epoch >= len(self.train_loader)))

    def _check_preemption(self) -> None:
        """Every rank stops at the same step: the flag is agreed with one all-reduce (only in
        multi-process runs). The checkpoint is written here; the loop then ends."""
        if self.preemption is None or not self.preemption.watching:
            return  # no signals watched: no per-step collective either
        if self.strategy.any_rank(self.preemption.received is not None):
            self.preempted_by = self.preemption.received or "a signal on another rank"
            self.say(f"{self.preempted_by} received: saving a checkpoint at step {self.state.step} and stopping")
            self.save_checkpoint()
            self._finalize_checkpoint(wait=True)

    def _log_train(self, grad_norm, stepped: bool) -> None:
        w = self._window
        batches = max(w["batches"], 1)
        sums = dict(w["values"])
        if self.manual is None and w["batches"]:  # none: every step of the window was skipped
            sums["loss"] = w["loss"]
        sums[_FLAG] = self.guard.flag_tensor() * batches  # rides on the window's all-reduce
        means = self._window_means(sums, batches)
        # read after the means reached the host: that waited for the device's queued work (the
        # window's last step included), so the clock measures what the device did, not what the
        # host queued (on CUDA the host runs ahead)
        elapsed = max(time.perf_counter() - w["start"], 1e-9)
        if self.guard.nonfinite_seen(means.pop(_FLAG)):
            self._nonfinite(self.guard.settle(self.strategy) or ("the training loss", None))
        unit, items = self.task.throughput_unit, w["items"] * self.strategy.data_parallel.size
        self.state.items_seen += items
        metrics = {**{f"train/{k}": v for k, v in means.items()}, f"train/{unit}_per_s": items / elapsed,
                   f"train/{unit}": float(self.state.items_seen)}
        if grad_norm is not None:
            metrics["train/grad_norm"] = float(grad_norm)
        scale = self.strategy.precision.loss_scale
        if scale is not None:
            metrics["train/loss_scale"] = float(scale)
        if not stepped:
            metrics["train/skipped_step"] = 1.0
        self.log_metrics(metrics)
        w["loss"].zero_()
        w["values"] = {}
        w["batches"] = w["items"] = 0
        w["start"] = time.perf_counter()

    def _window_means(self, sums: dict[str, torch.Tensor], batches: int) -> dict[str, float]:
        """Each value's mean per batch over the window and the ranks, with one all-reduce for
        all of them; a value with several elements (per-class counts) is logged as <key>/<i>."""
        keys = sorted(sums)
        if not keys:
            return {}
        flat = self.strategy.reduce(torch.cat([sums[k].reshape(-1) for k in keys]) / batches, "mean").tolist()
        means, start = {}, 0
        for key in keys:
            size = sums[key].numel()
            if sums[key].dim() == 0:
                means[key] = flat[start]
            else:
                means.update({f"{key}/{i}": value for i, value in enumerate(flat[start:start + size])})
            start += size
        return means

    # ---- validation ---------------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        started = time.perf_counter()
        self._nonfinite(self.guard.settle(self.strategy))  # never score (or select checkpoints by) NaN weights
        metrics = score(self.strategy, self.task, self.model, self.val_loader, "val")
        self.log_metrics(metrics)
        # validating and logging its scores is not training: off the throughput (a save the hooks
        # make below takes itself off)
        self._window["start"] += time.perf_counter() - started
        self.state.last_val_step = self.state.step
        self._hook("on_validation_end", metrics)
        return metrics

    # ---- test at the end of fit ----------------------------------------------------------
    def test_best(self) -> dict:
        """Collective: score the test split with the best checkpoint's weights (by the checkpoint
        callback's monitor; the newest without one; the final weights when the run saved none),
        log the metrics as test/<name> and return what was tested."""
        strategy = self.strategy
        checkpoint = next((cb for cb in self.callbacks.values() if isinstance(cb, ModelCheckpoint)), None)
        chosen, why = None, "the final weights: the run saved no checkpoint"
        if checkpoint is not None and strategy.is_global_zero:
            info, reason = checkpoint_to_evaluate(self.checkpoint_dir, checkpoint.monitor, checkpoint.mode)
            if info is not None:
                chosen, why = (str(info.path), info.step), reason
        chosen, why = strategy.broadcast((chosen, why)) if strategy.world_size > 1 else (chosen, why)
        path, step = chosen if chosen is not None else (None, self.state.step)
        if path is not None and step != self.state.step:  # the final weights are in the model already
            load_model_weights(strategy, self.model, Path(path))
        self.say(f"testing {path or 'the final weights'} (step {step}: {why})")
        metrics = score(strategy, self.task, self.model, self.test_loader, "test")
        self.log_metrics(metrics, step=step)  # the scores of the weights of that step
        self._hook("on_test_end", metrics)
        return {"checkpoint": path, "step": step, "chosen": why, "metrics": metrics}

    # ---- checkpoints --------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        """Collective. Hands the state to the CheckpointIO; with a synchronous one the checkpoint is
        complete on return, with an asynchronous one at a later step boundary (a checkpoint still
        being written is finished first)."""
        strategy = self.strategy
        self._finalize_checkpoint(wait=True)
        finite = weights_finite(self.model.parameters())
        verdict = self.guard.settle(strategy, finite)
        self._nonfinite(verdict)  # stop: raises, and nothing is written
        start = time.perf_counter()
        per_rank = {"loop": {
            "state": self.state.state_dict(),
            "rng": rng_state(),
            "data_position": self.data_position(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "precision": strategy.precision.state_dict(),
            "nonfinite": self.guard.state_dict(),
            "callbacks": {name: cb.state_dict() for name, cb in self.callbacks.items()},
            "train_window": {"loss": self._window["loss"].cpu(), "batches": self._window["batches"],
                             "items": self._window["items"],
                             "values": {k: v.cpu() for k, v in self._window["values"].items()}},
        }}
        if strategy.checkpoint_io.sharded:  # every rank writes its own part of one DCP directory
            shared, sharded = {}, strategy.sharded_state_dict(self.model, self.optimizer)
            sharded["model"] = self._saved_weights(sharded["model"])
        else:
            shared = {"model": self._saved_weights(strategy.model_state_dict(self.model)),
                      "optimizer": strategy.optimizer_state_dict(self.model, self.optimizer)}
            sharded = None
        meta = {**self.run_meta, "epoch": self.state.epoch, "metrics": self.state.fresh_metrics(),
                "finite": verdict is None}  # a warn-policy run saves non-finite weights: marked, never rotated in
        if self._adapter_weights is not None:
            meta["adapter_weights"] = len(self._adapter_weights)
        with announce_if_slow(f"saving the checkpoint of step {self.state.step}", strategy.is_global_zero):
            self._pending_checkpoint = begin_checkpoint(strategy, self.checkpoint_dir, self.state.step, shared,
                                                        per_rank, meta, sharded=sharded)
        if not strategy.checkpoint_io.is_async:
            self._finalize_checkpoint(wait=True)
        # how long training stood still for this save (an async save: the copy off the live state)
        blocked = time.perf_counter() - start
        self._window["start"] += blocked  # off the throughput, like validation
        self.log_metrics({"checkpoint/blocked_s": blocked})

    def _saved_weights(self, state: dict) -> dict:
        """The model state a checkpoint keeps: all of it, or with adapters only the trainable
        weights (the frozen ones are the pretrained model's, rebuilt with the run's config)."""
        if self._adapter_weights is None:
            return state
        return {name: value for name, value in state.items() if name in self._adapter_weights}

    def _finalize_checkpoint_if_written(self) -> None:
        """At a step boundary: finalize a background checkpoint once every rank's writes are done
        (one tiny all-reduce per step, only while a checkpoint is pending)."""
        if self._pending_checkpoint is None:
            return
        done = torch.tensor(0.0 if self.strategy.checkpoint_io.pending() else 1.0, device=self.strategy.root_device)
        if self.strategy.reduce(done, "min").item() == 1.0:
            self._finalize_checkpoint(wait=False)

    def _finalize_checkpoint(self, wait: bool) -> None:
        if self._pending_checkpoint is None:
            return
        pending, self._pending_checkpoint = self._pending_checkpoint, None
        path = finalize_checkpoint(self.strategy, pending)  # waits for the writes itself
        if self.strategy.is_global_zero:  # its size: what an adapter run's checkpoint saves shows here
            size = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
            self.say(f"saved checkpoint {path} ({human_bytes(size)}"
                     f"{', the adapters alone' if self._adapter_weights is not None else ''})")
        self._hook("on_checkpoint_saved", path)

    # ---- non-finite values (trainer.on_nonfinite: framework/loop/nonfinite.py) ---------------
    def _check_nonfinite(self) -> None:
        """After each step: act on what can be read without waiting (one process), and on a loss
        scaler's (or the skip policy's) skips in a row."""
        too_many = self.guard.too_many_skips()
        if too_many is not None:
            raise _NonFinite("the gradient norm", self.state.step, detail=too_many)
        self._nonfinite(self.guard.local_verdict())

    def _nonfinite(self, verdict) -> None:
        """Act on a verdict (what went non-finite, at which step) by the policy: stop (and skip,
        whose skipped steps never reach here) raise _NonFinite; warn says so once."""
        if verdict is None:
            return
        what, step = verdict
        if self.guard.policy == "warn":
            if not self.guard.warned:
                self.guard.warned = True
                at = f" at step {step}" if step is not None else ""
                self.say(f"WARNING: {what} became non-finite{at}; training goes on (trainer.on_nonfinite=warn). "
                         "Checkpoints of non-finite weights are marked in their meta.json and never replace the "
                         "last finite one.")
            return
        raise _NonFinite(what, step)

    def _stopped_nonfinite(self, stop: _NonFinite) -> FitResult:
        """End the run without saving: a checkpoint still being written (of finite weights: every
        save checks first) is finished, the loggers are closed."""
        self._finalize_checkpoint(wait=True)
        last = None
        if self.strategy.is_global_zero:
            last = newest_finite(self.checkpoint_dir)
        divergence = Divergence(stop.what, stop.step, self.state.step, self.guard.policy,
                                str(last) if last is not None else None, stop.detail)
        for logger in self.loggers:
            logger.finalize()
        return FitResult(dict(self.state.metrics), diverged=divergence)

    def _fit(self, state: dict) -> dict:
        """A saved model state made to fit this model's layers (a quantized run's weights for
        unquantized layers: framework/checkpoint/weights.py)."""
        return fit_saved_state(self.strategy.unwrap(self.model), state)

    def restore(self, path: Path) -> None:
        strategy = self.strategy
        if is_weights_file(Path(path)):  # plain weights: mapped, each rank copying its own part
            load_model_weights(strategy, self.model, Path(path))
            self.say(f"initialised the weights from {path} (weights only: a fresh optimizer, step 0)")
            return
        meta, objects = load_checkpoint_files(strategy.checkpoint_io, Path(path), strategy.global_rank)
        try:
            if is_sharded(meta):  # a DCP directory, resharded to this strategy and world size
                strategy.load_sharded_state_dict(self.model, self.optimizer, Path(path) / STATE_DIR)
            elif "optimizer" not in objects:
                strategy.load_model_state_dict(self.model, self._fit(objects["model"]))
                self.say(f"initialised the weights from {path} (weights only: a fresh optimizer, step 0)")
                return
            else:
                strategy.load_model_state_dict(self.model, self._fit(objects["model"]))
                strategy.load_optimizer_state_dict(self.model, self.optimizer, objects["optimizer"])
        except (RuntimeError, KeyError, ValueError) as err:
            raise CheckpointError(f"{path} does not fit this model/optimizer ({load_error_summary(err)}); "
                                  "it was saved from a different config (see its meta.json).") from err
        loop = objects["loop"]
        self.state.load_state_dict(loop["state"])
        saved_world = int(meta.get("world_size", strategy.world_size))
        position = loop.get("data_position") or _position_of_older_checkpoint(loop, meta, saved_world)
        self._check_same_data(position, path)
        self._resume_sample = int(position["sample"])
        self.state.batch_in_epoch = 0  # counted from the resume point: batches of this run's size
        set_rng_state(loop["rng"])  # at another world size, rank zero's streams: the old ones cannot be dealt out
        said = self._data_resume_note(position, meta, saved_world)
        if said:
            self.say(said)
        if self.scheduler is not None and loop["scheduler"] is not None:
            self.scheduler.load_state_dict(loop["scheduler"])
        strategy.precision.load_state_dict(loop["precision"])
        self.guard.load_state_dict(loop.get("nonfinite", {}))
        for name, cb in self.callbacks.items():
            if name in loop["callbacks"]:
                cb.load_state_dict(loop["callbacks"][name])
        window = loop["train_window"]
        self._window.update(loss=window["loss"].to(strategy.root_device), batches=window["batches"],
                            items=window["items"],  # values: a training_step's other outputs (older checkpoints lack them)
                            values={k: v.to(strategy.root_device) for k, v in window.get("values", {}).items()})
        for logger in self.loggers:
            logger.truncate(self.state.step)
        self.say(f"resumed from {path} at step {self.state.step} (epoch {self.state.epoch})")

    # ---- the data position: samples of the epoch's order (framework/data/sampler.py) ---------
    def data_position(self) -> dict:
        """Where training stands in its epoch, in samples of the epoch's order (all ranks
        together), so that a resume at any world size, batch size or accumulation continues on the
        next sample: {"epoch", "sample", "of"} plus what dealt it (ranks, batch), for the notes."""
        sampler, loader = self.train_loader.sampler, self.train_loader
        taken = self.state.batch_in_epoch
        sample = sampler.length if taken >= len(loader) else sampler.consumed(min(taken * loader.batch_size,
                                                                                   len(sampler)))
        return {"epoch": self.state.epoch, "sample": sample, "of": sampler.length,
                "ranks": sampler.replicas, "batch_size": loader.batch_size, "accumulate": self.trainer.accumulate,
                "fingerprint": self.data_fingerprint}

    def _check_same_data(self, position: dict, path) -> None:
        """A resume continues on the data it was trained on: another corpus (files added or changed,
        another tokenizer) is refused, unless data.allow_changed=true."""
        saved, now = position.get("fingerprint"), self.data_fingerprint
        if saved is None or now is None or saved == now:
            return
        length = position.get("of")
        sizes = (f" ({length:,} training samples then, {self.train_loader.sampler.length:,} now)"
                 if length is not None and length != self.train_loader.sampler.length else "")
        if not self.allow_changed_data:
            raise CheckpointError(f"{path} was trained on other data than this run's (fingerprint {saved}, now {now}"
                                  f"{sizes}): files were added or changed, or the tokenizer or a data setting "
                                  "differs. Resume with the same data, or set data.allow_changed=true to continue on "
                                  "this data (the position then counts samples of its order).")
        self.say(f"WARNING: the data differs from the checkpoint's (fingerprint {saved}, now {now}{sizes}); continuing "
                 "on it as data.allow_changed=true asks: the position counts samples of the new order")

    def _data_resume_note(self, position: dict, meta: dict, saved_world: int) -> str:
        """What a resume does with the data, said when the world, batch or accumulation changed
        (the same ones continue exactly as the run would have, nothing to say)."""
        sampler, loader, strategy = self.train_loader.sampler, self.train_loader, self.strategy
        before = (position.get("ranks"), position.get("batch_size"), position.get("accumulate"))
        now = (sampler.replicas, loader.batch_size, self.trainer.accumulate)
        if before == now and saved_world == strategy.world_size:
            return ""
        sample, length = int(position["sample"]), sampler.length
        rest = length - sample
        if getattr(loader.dataset, "streamed", False):  # an endless stream: no epoch to finish
            what = f"the stream continues at sample {sample:,} (no sample skipped or repeated)"
        elif rest <= 0:
            what = "the epoch it was in had ended: the next one starts"
        else:
            sampler.set_epoch(self.state.epoch, sample)  # (set again when the epoch starts)
            share, batches, ranks, batch = len(sampler), len(loader), sampler.replicas, loader.batch_size
            steps = -(-batches // self.trainer.accumulate)
            parts = [f"{steps} step(s) of up to {ranks} x {batch} x {self.trainer.accumulate} samples"]
            if share - batches * batch > 0:
                parts.append(f"{share - batches * batch} sample(s) per rank left over and dropped (data.drop_last)")
            elif batches and share - (batches - 1) * batch < batch:
                parts.append(f"its last batch {share - (batches - 1) * batch} sample(s) per rank")
            if share * ranks > rest:
                parts.append(f"{share * ranks - rest} position(s) at the end repeat the epoch's first samples, as at "
                             "every epoch's end")
            what = (f"the data continues at sample {sample} of {length} in epoch {self.state.epoch}'s order (no sample "
                    f"skipped or repeated); the epoch's other {rest} samples make {'; '.join(parts)}")
        ranks, batch, accumulate = (v if v is not None else "?" for v in before)
        return (f"resuming a checkpoint of {saved_world} process(es) ({ranks} data share(s) x batch {batch} x "
                f"accumulate {accumulate}) with {strategy.world_size} ({now[0]} x {now[1]} x {now[2]}): weights, "
                f"optimizer, step and epoch are exact; {what}")


def _position_of_older_checkpoint(loop: dict, meta: dict, saved_world: int) -> dict:
    """The data position of a checkpoint written before positions were kept in samples: the
    loader's batches handed out, times its batch size and the data shares it was dealt in."""
    shares = int(meta.get("data_parallel_size", saved_world))
    batch = int(((meta.get("config") or {}).get("data") or {}).get("batch_size") or 1)
    return {"epoch": loop["state"].get("epoch", 0), "sample": batches_yielded(loop.get("train_loader") or {}) * batch
            * shares, "of": None, "ranks": shares, "batch_size": batch, "accumulate": None}


_FLAG = "__nonfinite__"  # the guard's flag among the window's values


def _plain(node):
    """An OmegaConf node as a plain object with the same attributes (a dataclass instance for a
    structured config); anything else unchanged."""
    if not isinstance(node, DictConfig):
        return node
    obj = OmegaConf.to_object(node)
    return SimpleNamespace(**obj) if isinstance(obj, dict) else obj
