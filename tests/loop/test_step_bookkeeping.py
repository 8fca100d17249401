"""The loop's per-step bookkeeping on the CPU, where it is kept as Python numbers rather than tensor
operations (a tiny model's step notices every microsecond: benchmarks/step_overhead.py): the same
numbers as the tensor path, the same checkpoint format, the same verdicts."""
from __future__ import annotations

import math

import torch

from framework.callbacks.base import Callback, hook_methods
from framework.loop.metric_window import MetricWindow, StepSums
from framework.loop.nonfinite import NonFiniteGuard


def test_step_sums_on_the_cpu_equal_a_float64_tensor_sum_bit_for_bit():
    losses = [torch.tensor(v, dtype=dtype) for v, dtype in
              [(2.3456789, torch.float32), (1e-7, torch.float32), (3.1, torch.bfloat16), (0.1, torch.float32)]]
    step, window = StepSums("cpu"), MetricWindow("cpu")
    assert step.host and window.host
    expected = torch.zeros((), dtype=torch.float64)
    for loss in losses:
        step.add(loss.requires_grad_(loss.is_floating_point()), items=4)
        expected += loss.detach().double()
    assert step.loss.dtype == torch.float64 and step.loss.item() == expected.item()
    assert (step.batches, step.items) == (4, 16)
    window.add_step(step)
    window.add_step(step)
    assert window.sums(with_loss=True)["loss"].item() == (expected + expected).item()
    means = window.means(window.sums(with_loss=True), lambda flat: flat)
    assert means["loss"] == ((expected + expected) / 8).item()
    step.clear()
    assert (step.total, step.batches, step.items) == (0.0, 0, 0)


def test_window_state_keeps_the_tensor_format_and_loads_an_older_checkpoints():
    window = MetricWindow("cpu")
    step = StepSums("cpu")
    step.add(torch.tensor(1.25), items=2)
    window.add_step(step)
    state = window.state_dict()
    assert torch.is_tensor(state["loss"]) and state["loss"].dtype == torch.float64 and state["loss"].item() == 1.25
    older = {"loss": torch.tensor(0.75, dtype=torch.float64), "batches": 3, "items": 6}  # no "values" key
    window.load_state_dict(older)
    assert window.sums(with_loss=True)["loss"].item() == 0.75 and (window.batches, window.items) == (3, 6)
    window.reset()
    assert window.sums(with_loss=True) == {}  # no batches: no loss to report


def test_replica_groups_loss_joins_the_window_as_a_number_on_the_cpu():
    window, step = MetricWindow("cpu"), StepSums("cpu")
    step.add(torch.tensor(2.0), items=1)
    window.add_step(step, groups_loss=torch.tensor(3.0, dtype=torch.float64))
    sums = window.sums(with_loss=True)
    assert sums["loss"].item() == 3.0 and sums["group_loss"].item() == 2.0


def test_host_guard_verdict_after_a_non_finite_loss_and_none_before():
    guard = NonFiniteGuard("stop", 0, torch.device("cpu"), distributed=False, scaled=False)
    guard.observe_loss(torch.tensor(1.0))
    guard.observe_gradients(1, torch.tensor(0.5), stepped=True)
    assert guard.local_verdict() is None
    guard.observe_loss(torch.tensor(math.nan))
    guard.observe_gradients(2, torch.tensor(math.inf), stepped=True)
    assert guard.local_verdict() == ("the training loss", 2)
    guard.observe_gradients(3, torch.tensor(0.5), stepped=True)
    assert guard.local_verdict() == ("the training loss", 2)  # the first step it went non-finite stays


class _Counts(Callback):
    def __init__(self):
        self.steps = 0

    def on_train_step_end(self, loop) -> None:
        self.steps += 1


def test_hook_methods_leave_out_the_base_classs_empty_hooks_only():
    counting, plain, patched = _Counts(), Callback(), Callback()
    seen = []
    patched.on_train_step_end = lambda loop: seen.append(loop)  # defined on the instance: called

    class Duck:  # not a Callback: every hook it has is called
        def on_train_step_end(self, loop):
            seen.append("duck")

    methods = hook_methods([counting, plain, patched, Duck()], "on_train_step_end")
    assert len(methods) == 3
    for method in methods:
        method(None)
    assert counting.steps == 1 and seen == [None, "duck"]
    assert hook_methods([counting, plain], "on_fit_end") == []
