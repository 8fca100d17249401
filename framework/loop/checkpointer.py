"""The loop's checkpoints: save (collective; the CheckpointIO writes the bytes, synchronously or in
the background), finalise (a background checkpoint made complete once every rank's writes are
done, at a step boundary), and restore (weights, optimizer, and the loop's own state: step, RNG,
the data position, scheduler, loss scaler, non-finite guard, callbacks, the metric window).

The loop hands itself to `save` and `restore`: what goes into a checkpoint's loop state is the
loop's to say (framework/loop/loop_record.py), how it is written and read is here."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from framework.checkpoint.format import begin_checkpoint, finalize_checkpoint, is_sharded, load_checkpoint_files
from framework.checkpoint.load import load_model_weights
from framework.checkpoint.weights import fit_saved_state, is_weights_file, load_error_summary
from framework.checkpoint_io.dcp_reader import STATE_DIR
from framework.console import announce_if_slow, human_bytes
from framework.construction.named_state import regrouped
from framework.errors import CheckpointError
from framework.loop.loop_record import load_loop_state, loop_state
from framework.loop.nonfinite import weights_finite


class Checkpointer:
    def __init__(self, strategy, checkpoint_dir: Path, run_meta: dict, adapter_weights: list[str] | None, say,
                 hook):
        self.strategy = strategy
        self.checkpoint_dir = checkpoint_dir
        self.run_meta = run_meta
        self.adapter_weights = adapter_weights  # an adapter run saves its trainable weights alone
        self.say, self.hook = say, hook
        self.pending = None

    def save(self, loop) -> float:
        """Collective. Hands the state to the CheckpointIO; with a synchronous one the checkpoint is
        complete on return, with an asynchronous one at a later step boundary (a checkpoint still
        being written is finished first). Non-finite weights are judged by the loop's guard first
        (stop: nothing is written). Returns the seconds training stood still for it."""
        strategy = self.strategy
        self.finalize(wait=True)
        verdict = loop.guard.settle(strategy, weights_finite(loop.model.parameters()))
        loop.act_on_nonfinite(verdict)  # stop: raises, and nothing is written
        start = time.perf_counter()
        per_rank = {"loop": loop_state(loop)}
        if strategy.checkpoint_io.sharded:  # every rank writes its own part of one DCP directory
            shared, sharded = {}, strategy.sharded_state_dict(loop.model, loop.optimizer)
            sharded["model"] = self._saved_weights(sharded["model"])
        else:
            shared = {"model": self._saved_weights(strategy.model_state_dict(loop.model)),
                      "optimizer": strategy.optimizer_state_dict(loop.model, loop.optimizer)}
            sharded = None
        meta = {**self.run_meta, "epoch": loop.state.epoch, "metrics": loop.state.fresh_metrics(),
                "finite": verdict is None}  # a warn-policy run saves non-finite weights: marked, never rotated in
        if self.adapter_weights is not None:
            meta["adapter_weights"] = len(self.adapter_weights)
        with announce_if_slow(f"saving the checkpoint of step {loop.state.step}", strategy.is_global_zero):
            self.pending = begin_checkpoint(strategy, self.checkpoint_dir, loop.state.step, shared, per_rank, meta,
                                            sharded=sharded)
        if not strategy.checkpoint_io.is_async:
            self.finalize(wait=True)
        return time.perf_counter() - start  # (an async save: the copy off the live state)

    def _saved_weights(self, state: dict) -> dict:
        """The model state a checkpoint keeps: all of it, or with adapters only the trainable
        weights (the frozen ones are the pretrained model's, rebuilt with the run's config)."""
        if self.adapter_weights is None:
            return state
        return {name: value for name, value in state.items() if name in self.adapter_weights}

    def finalize_if_written(self) -> None:
        """At a step boundary: finalize a background checkpoint once every rank's writes are done
        (one tiny all-reduce per step, only while a checkpoint is pending)."""
        if self.pending is None:
            return
        strategy = self.strategy
        done = torch.tensor(0.0 if strategy.checkpoint_io.pending() else 1.0, device=strategy.root_device)
        if strategy.reduce(done, "min").item() == 1.0:
            self.finalize(wait=False)

    def finalize(self, wait: bool) -> None:
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        path = finalize_checkpoint(self.strategy, pending)  # waits for the writes itself
        if self.strategy.is_global_zero:  # its size: what an adapter run's checkpoint saves shows here
            size = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
            self.say(f"saved checkpoint {path} ({human_bytes(size)}"
                     f"{', the adapters alone' if self.adapter_weights is not None else ''})")
        self.hook("on_checkpoint_saved", path)

    def restore(self, loop, path: Path) -> None:
        """Weights, optimizer and the loop's state from `path`: a checkpoint of any strategy and
        world size, or plain weights (a fresh optimizer at step 0)."""
        strategy, path = self.strategy, Path(path)
        if is_weights_file(path):  # plain weights: mapped, each rank copying its own part
            load_model_weights(strategy, loop.model, path)
            self.say(f"initialised the weights from {path} (weights only: a fresh optimizer, step 0)")
            return
        meta, objects = load_checkpoint_files(strategy.checkpoint_io, path, strategy.global_rank)
        module = strategy.unwrap(loop.model)
        try:
            if is_sharded(meta):  # a DCP directory, resharded to this strategy and world size
                strategy.load_sharded_state_dict(loop.model, loop.optimizer, path / STATE_DIR)
            elif "optimizer" not in objects:
                strategy.load_model_state_dict(loop.model, fit_saved_state(module, objects["model"]))
                self.say(f"initialised the weights from {path} (weights only: a fresh optimizer, step 0)")
                return
            else:
                strategy.load_model_state_dict(loop.model, fit_saved_state(module, objects["model"]))
                strategy.load_optimizer_state_dict(loop.model, loop.optimizer,
                                                   regrouped(objects["optimizer"], module, loop.optimizer))
        except (RuntimeError, KeyError, ValueError) as err:
            raise CheckpointError(f"{path} does not fit this model/optimizer ({load_error_summary(err)}); "
                                  "it was saved from a different config (see its meta.json).") from err
        load_loop_state(loop, objects["loop"], meta, path)
        self.say(f"resumed from {path} at step {loop.state.step} (epoch {loop.state.epoch})")
