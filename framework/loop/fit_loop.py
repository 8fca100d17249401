"""The training loop: steps, accumulation, validation, callbacks, logging.

It talks to the strategy alone for anything device-, precision- or process-specific. Its rooms:
the metric window (framework/loop/metric_window.py), checkpoints (checkpointer.py), the data
position (data_position.py), the non-finite guard (nonfinite.py).
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace

import torch
from omegaconf import DictConfig, OmegaConf

from framework.adapter.lora import is_adapted, trainable_names
from framework.callbacks.base import hook_methods
from framework.checkpoint.format import newest_finite
from framework.console import warn
from framework.data.loaders import release_workers
from framework.errors import ConfigError
from framework.fault_tolerance.base import FaultTolerance
from framework.loop.checkpointer import Checkpointer
from framework.loop.evaluation import score
from framework.loop.metric_window import MetricWindow, StepSums
from framework.loop.nonfinite import Divergence, NonFiniteGuard, StopNonFinite
from framework.loop.parts import Loaders, RunContext, Training
from framework.loop.replica_steps import group_layout, heal_state, load_heal_state
from framework.loop.rollout_steps import rolled_out_steps, train_rolled
from framework.loop.state import FitResult, LoopState, Preemption, StepOutcome
from framework.loop.test_at_end import test_best
from framework.loop.utilization import Utilization
from framework.tasks.base import sums_normalised

_FLAG = "__nonfinite__"  # the guard's flag among the window's values (rides on the window's all-reduce)


class FitLoop:
    def __init__(self, training: Training, loaders: Loaders, trainer, run: RunContext):
        strategy = self.strategy = training.strategy
        self.task, self.model, self.optimizer = training.task, training.model, training.optimizer
        self.scheduler, self.scheduler_interval, self.manual = (training.scheduler, training.scheduler_interval,
                                                                training.manual)
        self.replicas = training.replicas or FaultTolerance()  # replica groups (fault_tolerance=torchft)
        self._quorum_formed = False  # the next step's quorum is formed already (a heal restarted the epoch's batches)
        self.train_loader, self.val_loader, self.test_loader = loaders.train, loaders.val, loaders.test
        # Read on every step: plain attributes, not OmegaConf nodes (each node access costs
        # tens of microseconds, which a tiny model's step notices).
        self.trainer = _plain(trainer)
        self.callbacks, self.loggers, self.preemption = run.callbacks, run.loggers, run.preemption
        self._hooks: dict[str, list] = {}  # a hook's name -> the callbacks' methods that do something
        self.output_dir = Path(run.output_dir)
        self.checkpoint_dir = self.output_dir / "checkpoints"
        self.run = run
        self.state = LoopState()
        self.preempted_by: str | None = None
        self._resume_sample = 0  # where in its epoch's order the first epoch after a resume starts
        self._first_step_at: float | None = None  # trainer.compile: when the run's first step began
        self._window = MetricWindow(strategy.root_device)
        self._step = StepSums(strategy.root_device)  # joins the window once the step is taken
        self._normalised = sums_normalised(self.task)  # the loss over the step's scored items (tasks/base.py)
        self._rolls_out = getattr(self.task, "rollout", None) is not None  # online learning (tasks/grpo.py)
        # between two of task.num_iterations steps on one rollout: (its batches, the next iteration, its group)
        self.rollout_left: tuple[list, int, int] | None = None
        self._accumulate = self.trainer.accumulate
        self.guard = NonFiniteGuard(self.trainer.on_nonfinite, self.trainer.nonfinite_skip_limit,
                                    strategy.root_device, distributed=strategy.world_size > 1,
                                    scaled=strategy.precision.loss_scale is not None)
        module = strategy.unwrap(self.model)
        self.utilization = Utilization(module, strategy.root_device, strategy.precision.compute_dtype,
                                       strategy.world_size, getattr(self.trainer, "peak_tflops", None),
                                       manual=training.manual is not None)
        self.checkpointer = Checkpointer(strategy, self.checkpoint_dir, run.run_meta,
                                         trainable_names(module) if is_adapted(module) else None, self.say, self.hook)

    # ---- public surface for callbacks --------------------------------------------------
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Record metrics at the current step (or at `step`: a checkpoint's test scores belong to the
        step it saved) and send them to the loggers (rank zero only)."""
        step = self.state.step if step is None else step
        self.state.metrics.update(metrics)
        self.state.metric_steps.update(dict.fromkeys(metrics, step))
        for logger in self.loggers:
            logger.log_metrics(metrics, step)
        self.hook("on_metrics", metrics)

    def say(self, message: str) -> None:
        if self.strategy.is_global_zero:
            print(message, flush=True)

    def warn(self, message: str) -> None:
        """A warning, said once for the run (rank zero), on stderr (framework/console.py `warn`)."""
        if self.strategy.is_global_zero:
            warn(message)

    def hook(self, name: str, *args) -> None:
        methods = self._hooks.get(name)
        if methods is None:
            methods = self._hooks[name] = hook_methods(self.callbacks.values(), name)
        for method in methods:
            method(self, *args)

    # ---- fit ----------------------------------------------------------------------------
    def fit(self, resume_from: Path | None = None) -> FitResult:
        try:
            return self._fit(resume_from)
        finally:
            release_workers(self.train_loader)  # its last iterator is kept by the loader (for state_dict)

    def _fit(self, resume_from: Path | None) -> FitResult:
        if len(self.train_loader) == 0:
            raise ConfigError("data: the training set gives no batches at this batch size and world size; "
                              "lower data.batch_size or set data.drop_last=false.")
        if resume_from is not None:
            self.checkpointer.restore(self, resume_from)
        if self.replicas.forms_groups:
            self.replicas.join(self.strategy, lambda: heal_state(self), lambda state: load_heal_state(self, state),
                               group_layout(self))
        self.model.train()
        self.hook("on_fit_start")
        try:
            if self.trainer.val_at_start and self.state.step == 0:
                self.validate()
            while not self._done():
                # healed: a live peer's state was copied (its step, its data position) in forming this
                # step's quorum; the epoch's batches start again there
                self._quorum_formed = self._run_epoch() is StepOutcome.HEALED
            if self.preempted_by is not None:
                self.checkpointer.finalize(wait=True)
                return FitResult(dict(self.state.metrics), Preemption(self.preempted_by, self.state.step))
            if self._window.batches:  # the steps since the last log (all of them in a run shorter than log_every)
                self._log_train(None, True)
            if self.state.last_val_step != self.state.step:
                self.validate()
            self.hook("on_fit_end")
        except StopNonFinite as stop:
            return self._stopped_nonfinite(stop)
        self.checkpointer.finalize(wait=True)
        tested = test_best(self) if self.test_loader is not None else None
        for logger in self.loggers:
            logger.finalize()
        return FitResult(dict(self.state.metrics), tested=tested)

    def _done(self) -> bool:
        t, s = self.trainer, self.state
        return (s.should_stop or self.preempted_by is not None or (t.max_steps is not None and s.step >= t.max_steps)
                or (t.max_epochs is not None and s.epoch >= t.max_epochs))

    def _run_epoch(self) -> StepOutcome | None:
        """One epoch's steps, or until the run ends. Returns the outcome of the step it stopped at:
        HEALED where the group copied a live peer's state before it (the epoch then goes on from the
        data position that state holds), None where the epoch ended."""
        strategy, k = self.strategy, self._accumulate
        self.train_loader.sampler.set_epoch(self.state.epoch, self._resume_sample)
        self._resume_sample = 0
        if self.rollout_left is not None:  # resumed between two iterations on one batch of completions
            rolled, first, group = self.rollout_left
            outcome = train_rolled(self, rolled, group, first, counted=False)
            if outcome is StepOutcome.HEALED or self._done():
                return outcome
        n = len(self.train_loader)
        pending: list = []  # this step's micro-batches, when they are counted before any forward
        for batch in self.train_loader:
            if not pending and self.state.batch_in_epoch % k == 0 and self._begin_step() is StepOutcome.HEALED:
                return StepOutcome.HEALED
            if self.trainer.compile and self._first_step_at is None:
                self._first_step_at = time.perf_counter()
            if self.manual is not None:
                outcome = self._manual_step(strategy.split_batch(strategy.batch_to_device(batch)))
                if self._done():
                    return outcome
                continue
            index = self.state.batch_in_epoch + len(pending)
            group = min(k, n - (index - index % k))  # the last group of an epoch may be short
            pending.append(batch)
            if (self._normalised or self._rolls_out) and len(pending) < group:
                continue
            if self._rolls_out:
                outcome = rolled_out_steps(self, pending, group)
                pending = []
                if outcome is StepOutcome.HEALED or (outcome is not None and self._done()):
                    return outcome
                continue
            scale = self._step_scale(pending) if self._normalised else None
            for batch in pending:
                self._micro_batch(batch, group, scale)
            pending = []
            if self._ends_step(self.state.batch_in_epoch):
                outcome = self._optimizer_step()
                if self._done():
                    return outcome
        self.state.epoch += 1
        self.state.batch_in_epoch = 0
        if self.scheduler is not None and self.scheduler_interval == "epoch":
            self.scheduler.step()
        self.hook("on_epoch_end")
        return None

    def _micro_batch(self, batch, group: int, scale: float | None, moved: bool = False) -> None:
        """Forward and backward of one micro-batch of a step of `group`. With `scale` (a task whose
        loss is normalised by the step's scored items) its summed loss times scale; else its loss
        over the group. `moved`: on the device already (a rollout's batch, whose float values are
        not the inputs a precision converts)."""
        strategy = self.strategy
        if self.utilization.waiting:
            self.utilization.see(batch)
        if not moved:
            batch = strategy.batch_to_device(batch)
        items = self.task.batch_size(batch)  # the whole batch's (a context-parallel rank gets a share of it)
        batch = strategy.split_batch(batch)
        with strategy.no_backward_sync(self.model, skip=not self._ends_step(self.state.batch_in_epoch + 1)):
            loss, logged = strategy.forward_backward(self.model, self.task, batch, group, scale, self._loss_of)
        self.guard.observe_loss(loss)
        if self.replicas.replica_groups > 1:  # logged as train/replicas: a mean per batch, like the loss
            self._window.add_values({"replicas": float(self.replicas.participants)})
        self._step.add(logged, items)
        self.state.batch_in_epoch += 1

    def _begin_step(self) -> StepOutcome | None:
        """HEALED where this group copied a live peer's state for the step about to start (the quorum
        of replica groups formed once a step), else None."""
        if self._quorum_formed:
            self._quorum_formed = False
            return None
        if not self.replicas.begin_step():
            return None
        heal = self.replicas.record().heals[-1]
        self.say(f"replicas: group {self.replicas.group} healed from a live peer at step {heal.step} in "
                 f"{heal.seconds:.2f} s")
        return StepOutcome.HEALED

    def _ends_step(self, batches_done: int) -> bool:
        """Whether the epoch's `batches_done`-th micro-batch is its step's last (every trainer.accumulate,
        and the epoch's last: its final group may be short)."""
        return batches_done % self._accumulate == 0 or batches_done == len(self.train_loader)

    def _step_scale(self, batches: list) -> float:
        """Data-parallel ranks / the items the step scores on all of them (one all-reduce): each
        rank's summed loss times this has, averaged over the ranks as gradients are, the gradient of
        the step's mean over every scored item."""
        strategy, share = self.strategy, self.strategy.data_parallel
        count = float(sum(self.task.scored_count(b) for b in batches))  # counted on the host, from the batches
        if strategy.world_size == 1:
            # no device round trip: a count sent to a GPU and read back waits for the step before
            # it to finish, and the host stops queueing work ahead of the device every step
            return 1.0 / max(count, 1.0)
        count = torch.tensor(count, dtype=torch.float64, device=strategy.root_device)
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
        self._window.add_values({k: v for k, v in returned.items() if k != "loss"})
        return returned["loss"]

    def _manual_step(self, batch) -> StepOutcome:
        """One batch of a manual-optimization task: it backpropagates and steps its optimizers
        itself (through self.manual), and returns the values to log."""
        self.manual.grad_norms.clear()
        self.manual.skipped.clear()
        with self.strategy.forward_context():
            values = self.task.training_step(self.model, batch, self.manual)
        if not isinstance(values, dict):
            raise ConfigError(f"task: {type(self.task).__name__}.training_step (manual optimization) must return a "
                              f"dict of scalar tensors to log, not {type(values).__name__}.")
        self._window.add_values(values)
        for value in values.values():
            self.guard.observe_loss(torch.as_tensor(value).to(self.strategy.root_device))
        self._window.add_batch(self.task.batch_size(batch))
        self.state.batch_in_epoch += 1
        norm = max(self.manual.grad_norms.values()) if self.manual.grad_norms else None
        outcome = StepOutcome.SKIPPED if self.manual.skipped else StepOutcome.TAKEN
        self._step_done(norm, outcome)
        return outcome

    def _optimizer_step(self) -> StepOutcome:
        strategy, t, guard = self.strategy, self.trainer, self.guard
        max_norm = t.clip_grad_norm
        if max_norm is None and guard.policy == "skip" and not guard.scaled:
            max_norm = float("inf")  # the norm the skip policy reads, computed the strategy's way; clips nothing
        groups_loss = self.replicas.average_gradients(self.model.parameters(), self._step.loss)
        grad_norm = strategy.clip_gradients(self.model, self.optimizer, max_norm, t.clip_grad_value)
        left_out = guard.skips_step(grad_norm)
        if not self.replicas.commit():  # every group votes, even one whose guard left the step out
            strategy.zero_grad(self.optimizer)  # not a step: its batches untrained, the groups' step unchanged
            self.task.after_optimizer_step(self.model, False)
            self._step.clear()
            self.warn(f"replicas: step {self.state.step + 1} was not committed (a group failed during it); its "
                      "batches are not trained, and the step is taken again with the next ones")
            return StepOutcome.DROPPED
        stepped = False if left_out else strategy.optimizer_step(self.optimizer)
        strategy.zero_grad(self.optimizer)
        self.task.after_optimizer_step(self.model, stepped)
        if not left_out:
            self._window.add_step(self._step, groups_loss)
        self._step.clear()
        outcome = StepOutcome.TAKEN if stepped else StepOutcome.SKIPPED
        self._step_done(grad_norm, outcome)
        return outcome

    def _step_done(self, grad_norm, outcome: StepOutcome) -> None:
        t, state = self.trainer, self.state
        stepped = outcome is StepOutcome.TAKEN
        if self.scheduler is not None and self.scheduler_interval == "step":
            self.scheduler.step()
        self.guard.observe_gradients(state.step + 1, grad_norm, stepped)
        state.step += 1
        if self._first_step_at:  # trainer.compile: said once
            self.say(f"compile: the first step took {time.perf_counter() - self._first_step_at:.1f} s, compiling "
                     "its forward and backward included")
            self._first_step_at = 0.0
        self.guard.after_step(state.step, self.warn)
        self.checkpointer.finalize_if_written()
        if state.step % t.log_every == 0:
            self._log_train(grad_norm, stepped)
        if state.step % t.val_every == 0 or self._last_step():
            self.validate()  # the run's last step validates here: before a checkpoint hook saves that step
        self.hook("on_train_step_end")
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
            self.checkpointer.finalize(wait=True)

    def _log_train(self, grad_norm, stepped: bool) -> None:
        window, strategy = self._window, self.strategy
        sums = window.sums(with_loss=self.manual is None)
        sums[_FLAG] = self.guard.flag_tensor() * max(window.batches, 1)
        means = window.means(sums, lambda flat: strategy.reduce(flat, "mean"))
        # read after the means reached the host: that waited for the device's queued work (the
        # window's last step included), so the clock measures what the device did, not what the
        # host queued (on CUDA the host runs ahead)
        elapsed = max(time.perf_counter() - window.start, 1e-9)
        if self.guard.nonfinite_seen(means.pop(_FLAG)):
            self.act_on_nonfinite(self.guard.settle(strategy) or ("the training loss", None))
        unit, items = self.task.throughput_unit, window.items * strategy.data_parallel.size
        groups = means.get("replicas", 1.0)  # replica groups step together, each a batch like this group's
        self.state.items_seen += items * groups
        metrics = {**{f"train/{k}": v for k, v in means.items()}, f"train/{unit}_per_s": items * groups / elapsed,
                   f"train/{unit}": float(self.state.items_seen)}
        self._log_utilization(metrics, items / elapsed)
        if grad_norm is not None:
            metrics["train/grad_norm"] = float(grad_norm)
        scale = strategy.precision.loss_scale
        if scale is not None:
            metrics["train/loss_scale"] = float(scale)
        if not stepped:
            metrics["train/skipped_step"] = 1.0
        self.log_metrics(metrics)
        window.reset()

    def _log_utilization(self, metrics: dict, items_per_s: float) -> None:
        mfu = self.utilization.of(items_per_s)
        if mfu is not None:
            metrics["train/mfu"] = mfu
        elif self.utilization.why_not and self.strategy.root_device.type != "cpu":
            self.say(f"train/mfu is not logged: {self.utilization.why_not}.")  # once: a CPU's peak is no table's
            self.utilization.why_not = ""

    # ---- validation ---------------------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        if self.val_loader is None:  # the data has no validation split (data.val_percent=0)
            return {}
        started = time.perf_counter()
        self.act_on_nonfinite(self.guard.settle(self.strategy))  # never score (or select checkpoints by) NaN weights
        metrics = score(self.strategy, self.task, self.model, self.val_loader, "val")
        self.log_metrics(metrics)
        # validating and logging its scores is not training: off the throughput (a save the hooks
        # make below takes itself off)
        self._window.take_off(time.perf_counter() - started)
        self.state.last_val_step = self.state.step
        self.hook("on_validation_end", metrics)
        return metrics

    # ---- checkpoints (framework/loop/checkpointer.py writes and reads them) ----------------
    def restore(self, path: Path) -> None:
        """Collective: weights, optimizer and the loop's state from a checkpoint (what a resume does)."""
        self.checkpointer.restore(self, path)

    def save_checkpoint(self) -> None:
        """Collective: a checkpoint of this step (complete on return, or at a later step boundary
        with an asynchronous CheckpointIO). The time training stood still for it is off the
        throughput and logged as checkpoint/blocked_s. With replica groups, one live group writes."""
        if not self.replicas.writes_checkpoints:
            return
        blocked = self.checkpointer.save(self)
        self._window.take_off(blocked)
        self.log_metrics({"checkpoint/blocked_s": blocked})

    # ---- non-finite values (trainer.on_nonfinite: framework/loop/nonfinite.py) ---------------
    def act_on_nonfinite(self, verdict) -> None:
        self.guard.act(verdict, self.warn)

    def _stopped_nonfinite(self, stop: StopNonFinite) -> FitResult:
        """End the run without saving: a checkpoint still being written (of finite weights: every
        save checks first) is finished, the loggers are closed."""
        self.checkpointer.finalize(wait=True)
        last = newest_finite(self.checkpoint_dir) if self.strategy.is_global_zero else None
        divergence = Divergence(stop.what, stop.step, self.state.step, self.guard.policy,
                                str(last) if last is not None else None, stop.detail)
        for logger in self.loggers:
            logger.finalize()
        return FitResult(dict(self.state.metrics), diverged=divergence)


def _plain(node):
    """An OmegaConf node as a plain object with the same attributes (a dataclass instance for a
    structured config); anything else unchanged."""
    if not isinstance(node, DictConfig):
        return node
    obj = OmegaConf.to_object(node)
    return SimpleNamespace(**obj) if isinstance(obj, dict) else obj
