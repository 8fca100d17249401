"""The Callback base class: hooks the loop calls, in this order."""
from __future__ import annotations


class Callback:
    """Override any hook. `loop` is the running framework.loop.fit_loop.FitLoop: read
    `loop.state` (step, epoch, metrics), call `loop.log_metrics` or `loop.save_checkpoint`, set
    `loop.state.should_stop`.

    Order: on_fit_start -> (per optimizer step) on_train_step_end -> (when validating)
    on_validation_end -> (per epoch) on_epoch_end -> on_fit_end -> (trainer.test_at_end)
    on_test_end. Validation that is due at a
    step runs before that step's on_train_step_end, so a checkpoint sees fresh metrics.
    """

    def on_fit_start(self, loop) -> None: ...

    def on_train_step_end(self, loop) -> None: ...

    def on_metrics(self, loop, metrics: dict[str, float]) -> None:
        """Called whenever metrics are logged (training, validation, or by a callback)."""

    def on_validation_end(self, loop, metrics: dict[str, float]) -> None: ...

    def on_epoch_end(self, loop) -> None: ...

    def on_checkpoint_saved(self, loop, path) -> None:
        """A checkpoint became complete (for an asynchronous checkpoint_io, after its writes)."""

    def on_fit_end(self, loop) -> None: ...

    def on_test_end(self, loop, metrics: dict[str, float]) -> None:
        """trainer.test_at_end scored the test split (after on_fit_end, with the best checkpoint's weights)."""

    def state_dict(self) -> dict:
        """What this callback needs to continue exactly after a resume."""
        return {}

    def load_state_dict(self, state: dict) -> None: ...


def hook_methods(callbacks, name: str) -> list:
    """The callbacks' `name` methods that do something: those a callback's class (or the callback
    itself) defines, not the base class's empty ones (the loop calls some hooks every step)."""
    inherited = getattr(Callback, name, None)
    return [getattr(callback, name) for callback in callbacks
            if inherited is None or getattr(type(callback), name, None) is not inherited
            or name in getattr(callback, "__dict__", {})]
