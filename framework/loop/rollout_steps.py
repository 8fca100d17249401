"""A task that makes its training batches from the model (online learning: task.rollout, framework/tasks/grpo.py):
the FitLoop's steps for it, one rollout trained for task.num_iterations optimizer steps."""
from __future__ import annotations

from framework.loop.state import StepOutcome
from framework.tasks.rollout import Ranks


def rolled_out_steps(loop, pending: list, group: int) -> StepOutcome | None:
    """A task that makes its training batches from the model (online learning: task.rollout):
    the step's micro-batches rolled out once, before any forward, then trained for
    task.num_iterations optimizer steps (the same prompts and completions each time). Returns
    the last step's outcome (None: the run ended before one; HEALED: see train_rolled)."""
    strategy = loop.strategy
    share = strategy.data_parallel.size / strategy.world_size  # a tensor-parallel group's ranks count once
    # ranks decode alike only where the forward is collective (ddp's ranks each stop once their rows have)
    ranks = Ranks(lambda t: strategy.reduce(t, "sum") * share,
                  strategy.world_size > 1 and strategy.abilities.collective_forward)
    moved = [strategy.batch_to_device(b) for b in pending]
    with strategy.forward_context():
        rolled = loop.task.rollout(strategy.unwrap(loop.model), moved, loop.state.step, ranks)
    return train_rolled(loop, rolled, group)

def train_rolled(loop, rolled: list, group: int, first: int = 0, counted: bool = True) -> StepOutcome | None:
    """Iterations `first`.. of task.num_iterations on rolled-out micro-batches, one optimizer step
    each. Between two of them a checkpoint keeps the batches and the next iteration
    (`rollout_left`), so a resume goes on with them (`counted` False: their prompts were counted
    in the data position before the resume). HEALED: replica groups formed the quorum of an
    iteration after the first and this group took a live peer's state in its place."""
    start, outcome = loop.state.batch_in_epoch, None
    iterations = int(getattr(loop.task, "num_iterations", 1))
    for iteration in range(first, iterations):
        # each optimizer step forms its replica groups' quorum (the first one's is formed before the
        # rollout); a group that heals here copies a live peer's batches and iteration with its state
        if iteration > 0 and loop._begin_step() is StepOutcome.HEALED:
            return StepOutcome.HEALED
        loop.state.batch_in_epoch = start
        scale = loop._step_scale(rolled) if loop._normalised else None
        for batch in rolled:
            loop._micro_batch(batch, group, scale, moved=True)
        if not counted:
            loop.state.batch_in_epoch = start
        loop.rollout_left = (rolled, iteration + 1, group) if iteration + 1 < iterations else None
        outcome = loop._optimizer_step()
        if loop._done():
            break
    return outcome
