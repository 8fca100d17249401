"""What a checkpoint (or a healing replica group's peer) keeps of the training loop, per rank, and
putting it back: counters, RNG, the data position, scheduler, precision, the non-finite guard,
callbacks, the metric window and the replica groups' state. The checkpointer
(framework/loop/checkpointer.py) and the heal (replica_steps.py) read and write it through here."""
from __future__ import annotations

from pathlib import Path

from framework.checkpoint.rng import rng_state, set_rng_state
from framework.errors import CheckpointError
from framework.loop.data_position import changed_data, data_position, position_of_older_checkpoint, resume_note
from framework.tensors import map_tensors


def loop_state(loop) -> dict:
    """What a checkpoint keeps of `loop` (a FitLoop), per rank."""
    position = data_position(loop.train_loader, loop.state.batch_in_epoch, loop.state.epoch, loop._accumulate,
                             loop.run.data_fingerprint)
    return {"state": loop.state.state_dict(), "rng": rng_state(), "data_position": position,
            "scheduler": loop.scheduler.state_dict() if loop.scheduler is not None else None,
            "precision": loop.strategy.precision.state_dict(), "nonfinite": loop.guard.state_dict(),
            "callbacks": {name: cb.state_dict() for name, cb in loop.callbacks.items()},
            "train_window": loop._window.state_dict(), "replicas": loop.replicas.state_dict(),
            "rollout_left": _rollout_left(loop)}


def _rollout_left(loop) -> dict | None:
    """Between two of task.num_iterations steps on one rollout: its batches (on the CPU) and the next
    iteration, which a resume trains before reading new prompts."""
    if loop.rollout_left is None:
        return None
    rolled, iteration, group = loop.rollout_left
    return {"batches": map_tensors(rolled, lambda t: t.cpu()), "next_iteration": iteration, "group": group}


def load_loop_state(loop, saved: dict, meta: dict, path: Path) -> None:
    """`saved` (loop_state's, from a checkpoint of any world size) into `loop`: the data continues on
    the next sample of the epoch's order (said when the world, batch or accumulation changed)."""
    strategy = loop.strategy
    loop.state.load_state_dict(saved["state"])
    saved_world = int(meta.get("world_size", strategy.world_size))
    position = saved.get("data_position") or position_of_older_checkpoint(saved, meta, saved_world)
    warning = changed_data(position, loop.run.data_fingerprint, loop.train_loader.sampler.length,
                           loop.run.allow_changed_data, path)
    if warning:
        loop.warn(warning)
    loop._resume_sample = int(position["sample"])
    loop.state.batch_in_epoch = 0  # counted from the resume point: batches of this run's size
    set_rng_state(saved["rng"])  # at another world size, rank zero's streams: the old ones cannot be dealt out
    note = resume_note(position, saved_world, loop.train_loader, strategy.world_size, loop.state.epoch,
                       loop._accumulate)
    if note:
        loop.say(note)
    if loop.scheduler is not None and saved["scheduler"] is not None:
        loop.scheduler.load_state_dict(scheduler_for_groups(saved["scheduler"], len(loop.optimizer.param_groups)))
    strategy.precision.load_state_dict(saved["precision"])
    loop.guard.load_state_dict(saved.get("nonfinite", {}))
    for name, cb in loop.callbacks.items():
        if name in saved["callbacks"]:
            cb.load_state_dict(saved["callbacks"][name])
    loop._window.load_state_dict(saved["train_window"])
    left = saved.get("rollout_left")
    if left is not None:
        if saved_world != strategy.world_size:
            raise CheckpointError(f"{path} was saved between two of task.num_iterations steps on one batch of "
                                  f"completions, each of its {saved_world} ranks holding its share of them; resume it "
                                  f"at {saved_world} processes, or from a checkpoint at a step that is a multiple of "
                                  "task.num_iterations.")
        batches = map_tensors(left["batches"], lambda t: t.to(strategy.root_device))
        loop.rollout_left = (batches, int(left["next_iteration"]), int(left["group"]))
    loop.replicas.load_state_dict(saved.get("replicas"))
    for logger in loop.loggers:
        logger.truncate(loop.state.step)


# A scheduler's state that holds one entry per parameter group (torch's LR schedulers, and
# SequentialLR's or ChainedScheduler's inner ones under _schedulers)
PER_GROUP = ("base_lrs", "_last_lr", "lr_lambdas", "min_lrs", "max_lrs", "initial_lrs")


def scheduler_for_groups(state: dict, groups: int) -> dict:
    """A saved scheduler state laid out for an optimizer of `groups` parameter groups: a checkpoint
    written with one group (before biases and norms had their own, framework/tasks/decay.py) gives
    each group its entry, and one written with several loads into one (their first)."""
    fitted = dict(state)
    for key in PER_GROUP:
        value = state.get(key)
        if isinstance(value, list) and value and len(value) != groups and (len(value) == 1 or groups == 1):
            fitted[key] = [value[0]] * groups
    if isinstance(state.get("_schedulers"), list):
        fitted["_schedulers"] = [scheduler_for_groups(inner, groups) if isinstance(inner, dict) else inner
                                 for inner in state["_schedulers"]]
    return fitted
