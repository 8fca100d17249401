"""What the loop does for replica groups (fault_tolerance=torchft, framework/fault_tolerance/):
the whole training state a healing peer copies, and taking it from a live one. A group that copies
a peer's state continues from the step and data position that state holds (FitLoop restarts its
epoch's batches there)."""
from __future__ import annotations

from pathlib import Path


def heal_state(loop) -> dict:
    """This rank's whole training state, for the same rank of a group that heals from it (read on
    torchft's thread while the loop waits for the step's quorum: nothing changes it meanwhile)."""
    return {"model": loop.strategy.unwrap(loop.model).state_dict(), "optimizer": loop.optimizer.state_dict(),
            "loop": loop.loop_state()}


def load_heal_state(loop, state: dict) -> None:
    """A live peer's state (heal_state) in place of this rank's: weights, optimizer, the loop's step,
    data position, scheduler, RNG, guard and callbacks' state, as a resume loads them."""
    loop.strategy.unwrap(loop.model).load_state_dict(state["model"])
    loop.optimizer.load_state_dict(state["optimizer"])
    loop.load_loop_state(state["loop"], {"world_size": loop.strategy.world_size}, Path("a live replica group"))
    loop.say(f"replicas: group {loop.replicas.group} healed from a live peer at step {loop.state.step}")
