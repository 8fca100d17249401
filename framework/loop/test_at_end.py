"""trainer.test_at_end: when fit ends, the test split scored with the best checkpoint's weights (by
the checkpoint callback's monitor; the newest without one; the final weights when the run saved
none), logged as test/<name> at the step of the weights tested."""
from __future__ import annotations

from pathlib import Path

from framework.callbacks.checkpoint import ModelCheckpoint
from framework.checkpoint.load import checkpoint_to_evaluate, load_model_weights
from framework.loop.evaluation import score


def test_best(loop) -> dict:
    """Collective: score `loop`'s test loader with the chosen weights; what was tested."""
    strategy = loop.strategy
    checkpoint = next((cb for cb in loop.callbacks.values() if isinstance(cb, ModelCheckpoint)), None)
    chosen, why = None, "the final weights: the run saved no checkpoint"
    if checkpoint is not None and strategy.is_global_zero:
        info, reason = checkpoint_to_evaluate(loop.checkpoint_dir, checkpoint.monitor, checkpoint.mode)
        if info is not None:
            chosen, why = (str(info.path), info.step), reason
    chosen, why = strategy.broadcast((chosen, why)) if strategy.world_size > 1 else (chosen, why)
    path, step = chosen if chosen is not None else (None, loop.state.step)
    if path is not None and step != loop.state.step:  # the final weights are in the model already
        load_model_weights(strategy, loop.model, Path(path))
    loop.say(f"testing {path or 'the final weights'} (step {step}: {why})")
    metrics = score(strategy, loop.task, loop.model, loop.test_loader, "test")
    loop.log_metrics(metrics, step=step)  # the scores of the weights of that step
    loop.hook("on_test_end", metrics)
    return {"checkpoint": path, "step": step, "chosen": why, "metrics": metrics}
