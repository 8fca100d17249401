"""`trainer.on_nonfinite`: what the loop does when the loss or the gradients stop being finite.

A run whose loss goes NaN or infinite never recovers by itself; left alone it validates NaN,
saves NaN checkpoints and rotates the good ones away. The guard watches the values the loop has
anyway (each micro-batch's loss, the step's gradient norm) with device operations only, and
reads them on the host where that costs nothing:

- one process on the CPU: after every step;
- one process on CUDA: the flags are copied to pinned memory without blocking and read once the
  copy is done (a step or so later), never waiting for the device;
- several processes: where the ranks already meet (the logging all-reduce, validation, a
  checkpoint), so every rank takes the same decision at the same step.

Policies: `stop` (the default) ends the run with ExitCode.DIVERGED, writing no checkpoint with
non-finite weights; `skip` leaves out the optimizer step of a non-finite gradient (the gradient
norm is read on the host each step for it: one device sync per step) and stops after
`nonfinite_skip_limit` skips in a row; `warn` says so once and goes on. A loss scaler's skipped
steps (fp16) count as skips under every policy: a scaler that skips step after step has lost.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from framework.errors import ExitCode

WHAT = ("the training loss", "the gradient norm")  # the flags, in order
ADVICE = ("a lower learning rate (optimizer.lr), gradient clipping (trainer.clip_grad_norm=1.0), a learning-rate "
          "warm-up, or bf16 instead of fp16 (precision=bf16 / bf16_true, same range as float32)")


@dataclass(frozen=True)
class Divergence:
    """Why and where a run stopped for non-finite numbers (picklable: it travels from the workers)."""

    what: str
    """What stopped being finite: 'the training loss', 'the gradient norm', 'the weights', or the
    loss scaler's run of skipped steps."""
    step: int | None
    """The optimizer step at which it was first seen (None: not known, e.g. the weights)."""
    stopped_at: int
    """The step the run stopped at (ranks agree at logging, validation and checkpoints)."""
    policy: str
    last_finite_checkpoint: str | None = None
    detail: str = ""
    """Set when the run stopped for skipped steps in a row rather than for one value."""

    def describe(self) -> str:
        at = f" at step {self.step}" if self.step is not None else ""
        noticed = (f" (noticed at step {self.stopped_at}, where the ranks meet)"
                   if self.step is not None and self.step != self.stopped_at else "")
        kept = (f"The last checkpoint with finite weights: {self.last_finite_checkpoint} (start from it with "
                f"ckpt_path={self.last_finite_checkpoint} and one of these changes)."
                if self.last_finite_checkpoint else "No checkpoint had been saved.")
        happened = self.detail or f"{self.what} was non-finite{at}{noticed}"
        return (f"{happened}; the run stopped (trainer.on_nonfinite={self.policy}) and "
                f"saved no non-finite weights. {kept} To try: {ADVICE}; or trainer.on_nonfinite=skip to leave such "
                f"steps out, =warn to train on regardless. Exit code {int(ExitCode.DIVERGED)}.")


class Diverged(Exception):
    """Raised in the launching process when the run stopped for non-finite numbers."""

    def __init__(self, divergence: Divergence):
        self.divergence = divergence
        super().__init__(divergence.describe())


class StopNonFinite(Exception):
    """Inside the loop: the guard decided to stop (trainer.on_nonfinite); fit() ends the run."""

    def __init__(self, what: str, step: int | None, detail: str = ""):
        super().__init__(what)
        self.what, self.step, self.detail = what, step, detail


class NonFiniteGuard:
    """The loop's watch on non-finite values. Per micro-batch `observe_loss`, per step
    `observe_gradients` (and `skips_step` first under the skip policy), then `local_verdict`
    where a host read is free and `flag_tensor`/`settle` where the ranks meet."""

    def __init__(self, policy: str, skip_limit: int, device: torch.device, distributed: bool, scaled: bool):
        self.policy = policy
        self.skip_limit = skip_limit
        self.distributed = distributed
        self.scaled = scaled  # a loss scaler skips steps of non-finite gradients itself
        self.device = device
        self._flags = torch.zeros(len(WHAT), dtype=torch.bool, device=device)
        self._first = torch.full((len(WHAT),), -1, dtype=torch.long, device=device)
        self._step_loss_bad = torch.zeros((), dtype=torch.bool, device=device)
        self.skips_in_a_row = 0
        self.skipped = 0
        self.warned = False
        self._copy = None  # (pinned host flags, pinned host first steps, CUDA event) of a pending copy
        # On the CPU a "device" value is already on the host: read it there, as Python numbers (a
        # handful of tensor operations per step cost a tiny model's step ~0.1 ms; a read costs ~1 us).
        self._host = device.type == "cpu"
        self._host_loss_bad = False
        self._host_flagged = False  # on the CPU: whether _flags holds anything (read every step)

    # ---- per micro-batch and per step: device operations only (host reads on the CPU) -----------
    def observe_loss(self, loss: torch.Tensor) -> None:
        if self._host:
            self._host_loss_bad |= not (math.isfinite(loss.item()) if loss.numel() == 1
                                        else bool(torch.isfinite(loss.detach()).all()))
            return
        self._step_loss_bad |= ~torch.isfinite(loss.detach()).all()

    def observe_gradients(self, step: int, grad_norm, stepped: bool) -> None:
        """At the end of optimizer step `step` (1-based): record this step's flags. A skipped step
        (by the skip policy or a loss scaler) counts towards the limit of skips in a row."""
        self.skips_in_a_row = 0 if stepped else self.skips_in_a_row + 1
        self.skipped += not stepped
        if self._host:
            self._observe_on_host(step, grad_norm, stepped)
            return
        bad = [self._step_loss_bad]
        if grad_norm is not None and not self.scaled and torch.is_tensor(grad_norm):
            bad.append(~torch.isfinite(grad_norm.detach().to(self.device)).reshape(()))
        elif grad_norm is not None and not self.scaled:
            bad.append(torch.tensor(not math.isfinite(float(grad_norm)), device=self.device))
        else:
            bad.append(torch.zeros((), dtype=torch.bool, device=self.device))
        now = torch.stack(bad)
        if not stepped and self.policy == "skip":
            now = torch.zeros_like(now)  # left out on purpose: counted as a skip, not as a divergence
        self._first = torch.where(now & (self._first < 0), torch.full_like(self._first, step), self._first)
        self._flags |= now
        self._step_loss_bad = torch.zeros_like(self._step_loss_bad)
        if self.device.type == "cuda" and not self.distributed:
            self._start_copy()

    def _observe_on_host(self, step: int, grad_norm, stepped: bool) -> None:
        gradients_bad = (grad_norm is not None and not self.scaled
                         and not math.isfinite(grad_norm.item() if torch.is_tensor(grad_norm) else float(grad_norm)))
        loss_bad, self._host_loss_bad = self._host_loss_bad, False
        if not (loss_bad or gradients_bad) or (not stepped and self.policy == "skip"):  # a skip: not a divergence
            return
        now = [loss_bad, gradients_bad]
        flags, first = self._flags.tolist(), self._first.tolist()
        for i, bad in enumerate(now):
            if bad:
                flags[i] = True
                first[i] = step if first[i] < 0 else first[i]
        self._flags = torch.tensor(flags, dtype=torch.bool, device=self.device)
        self._first = torch.tensor(first, dtype=torch.long, device=self.device)
        self._host_flagged = True

    def skips_step(self, grad_norm: torch.Tensor | None) -> bool:
        """The skip policy, before the optimizer steps: whether this step's gradient norm is
        non-finite (a host read). The norm is the same on every rank, so are the decisions."""
        if self.policy != "skip" or self.scaled or grad_norm is None:
            return False
        return not bool(torch.isfinite(torch.as_tensor(grad_norm)).all())

    # ---- host reads --------------------------------------------------------------------------------
    def _start_copy(self) -> None:
        if self._copy is not None and not self._copy[2].query():
            return  # the previous copy is still on its way: read that one first
        flags = torch.empty(self._flags.shape, dtype=torch.bool, pin_memory=True)
        first = torch.empty(self._first.shape, dtype=torch.long, pin_memory=True)
        flags.copy_(self._flags, non_blocking=True)
        first.copy_(self._first, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._copy = (flags, first, event)

    def local_verdict(self) -> tuple[str, int | None] | None:
        """What went non-finite on this rank and at which step, read where that costs nothing
        (None when nothing did, or when it cannot be read without waiting for the device or the
        other ranks). Only a single process acts on it between the ranks' meeting points."""
        if self.distributed:
            return None
        if self.device.type == "cpu":
            return self._verdict(self._flags.tolist(), self._first.tolist()) if self._host_flagged else None
        if self._copy is not None and self._copy[2].query():
            return self._verdict(self._copy[0].tolist(), self._copy[1].tolist())
        return None

    def flag_tensor(self) -> torch.Tensor:
        """1.0 where this rank saw a non-finite value, as a float scalar on the device (to ride on
        an all-reduce the loop makes anyway)."""
        return self._flags.any().to(torch.float64)

    def settle(self, strategy, weights_finite: bool | None = None) -> tuple[str, int | None] | None:
        """At a meeting point of the ranks (collective in a multi-process run): what went non-finite
        on any rank, or None. `weights_finite`: this rank's weights, checked before a checkpoint."""
        local = self._verdict(self._flags.tolist(), self._first.tolist())
        if weights_finite is False and local is None:
            local = ("the weights", None)
        if not self.distributed:
            return local
        never = 1e18  # a flagged rank that knows no step sorts after those that do
        row = [-1.0, -1.0] if local is None else [float(WHAT.index(local[0]) if local[0] in WHAT else len(WHAT)),
                                                  float(local[1]) if local[1] is not None else never]
        rows = strategy.all_gather(torch.tensor(row, dtype=torch.float64, device=strategy.root_device)).tolist()
        flagged = sorted((step, code) for code, step in rows if code >= 0)
        if not flagged:
            return None
        step_value, code = flagged[0]
        what = WHAT[int(code)] if int(code) < len(WHAT) else "the weights"
        return what, (int(step_value) if step_value < never else None)

    def nonfinite_seen(self, agreed: float) -> bool:
        """Whether a flag carried on the loop's logging all-reduce (a mean over ranks) says a rank
        saw a non-finite value."""
        return agreed > 0 or math.isnan(agreed)

    @staticmethod
    def _verdict(flags: list, first: list) -> tuple[str, int | None] | None:
        seen = [(first[i] if first[i] >= 0 else None, WHAT[i]) for i in range(len(WHAT)) if flags[i]]
        if not seen:
            return None
        step, what = min(seen, key=lambda item: (item[0] is None, item[0] or 0))
        return what, step

    # ---- acting on a verdict, by the policy --------------------------------------------------------
    def act(self, verdict, warn) -> None:
        """Act on a verdict (what went non-finite, at which step): stop (and skip, whose skipped
        steps never reach here) raise StopNonFinite; warn says so once (`warn`: rank zero's)."""
        if verdict is None:
            return
        what, step = verdict
        if self.policy != "warn":
            raise StopNonFinite(what, step)
        if not self.warned:
            self.warned = True
            at = f" at step {step}" if step is not None else ""
            warn(f"{what} became non-finite{at}; training goes on (trainer.on_nonfinite=warn). Checkpoints "
                "of non-finite weights are marked in their meta.json and never replace the last finite one.")

    def after_step(self, step: int, warn) -> None:
        """After each step: act on what can be read without waiting (one process), and on a loss
        scaler's (or the skip policy's) skips in a row."""
        too_many = self.too_many_skips()
        if too_many is not None:
            raise StopNonFinite("the gradient norm", step, detail=too_many)
        self.act(self.local_verdict(), warn)

    # ---- the scaler's and the skip policy's skips --------------------------------------------------
    def too_many_skips(self) -> str | None:
        """Why to stop when steps were skipped `skip_limit` times in a row (their gradients were
        non-finite), else None."""
        if self.skip_limit and self.skips_in_a_row >= self.skip_limit and self.policy != "warn":
            who = "fp16's loss scaler" if self.scaled else "trainer.on_nonfinite=skip"
            return (f"the gradients were non-finite {self.skips_in_a_row} steps in a row ({who} skipped them; "
                    f"trainer.nonfinite_skip_limit={self.skip_limit})")
        return None

    def state_dict(self) -> dict:
        return {"skipped": self.skipped, "skips_in_a_row": self.skips_in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.skipped = int(state.get("skipped", 0))
        self.skips_in_a_row = int(state.get("skips_in_a_row", 0))


def weights_finite(parameters) -> bool:
    """Whether every local element of `parameters` (a rank's shards under a sharding strategy) is
    finite: one host read."""
    checks = []
    for p in parameters:
        local = p.to_local() if hasattr(p, "to_local") else p
        if local.numel() and local.is_floating_point():
            checks.append(torch.isfinite(local.detach()).all())
    return bool(torch.stack(checks).all()) if checks else True
