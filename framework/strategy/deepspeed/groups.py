"""DeepSpeed keeps module-level references to the process groups it made (its clone of the world
group above all). Once the framework destroys torch's process group, those references name
groups torch no longer knows, and the next DeepSpeed run in the same process (a Hydra sweep's
second job, a notebook, a test session) fails in ZeRO-3's set-up with "Group ... is not
registered". Forgetting them at teardown lets DeepSpeed clone the new world group afresh."""

from __future__ import annotations

import sys

# The module globals DeepSpeed 0.16-0.19 caches process groups in (deepspeed/utils/groups.py).
_CACHED_GROUPS = ("_WORLD_GROUP", "_ZERO_PARAM_INTRA_PARALLEL_GROUP", "_DATA_PARALLEL_GROUP",
                  "_MODEL_PARALLEL_GROUP", "_TENSOR_MODEL_PARALLEL_GROUP")
_CACHED_GROUP_MAPS = ("_EXPERT_PARALLEL_GROUP", "_EXPERT_PARALLEL_GROUP_RANKS", "_EXPERT_DATA_PARALLEL_GROUP",
                      "_EXPERT_DATA_PARALLEL_GROUP_RANKS", "_ALL_TO_ALL_GROUP")


def forget_process_groups() -> None:
    """Drop DeepSpeed's references to the process groups of a run that has ended."""
    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is None:  # DeepSpeed was never imported: nothing cached
        return
    release = getattr(groups, "_release_process_group_references", None)
    if release is not None:  # DeepSpeed >= 0.19 releases them itself when told the world is gone
        release(group=None)
        return
    for name in _CACHED_GROUPS:
        if hasattr(groups, name):
            setattr(groups, name, None)
    for name in _CACHED_GROUP_MAPS:
        cached = getattr(groups, name, None)
        if isinstance(cached, dict):
            cached.clear()
