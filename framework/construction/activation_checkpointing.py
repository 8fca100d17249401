"""`trainer.activation_checkpointing=true`: each sharding unit (framework/construction/units.py, the
same rule for every strategy) keeps only its input during forward and recomputes its activations
in backward, trading one more forward per unit for activation memory.

torch's non-reentrant checkpoint is used (DeepSpeed's own is reentrant: a block whose input does
not require grad silently gets no gradients). The unit's `forward` is wrapped in place, so module
and parameter names, and so checkpoints, are unchanged; a sharding wrapper's hooks stay outside,
gathering the unit's parameters for the recomputation as for the forward.
"""
from __future__ import annotations

import functools

from torch.utils.checkpoint import checkpoint

from framework.construction.units import Units


def checkpoint_units(units: Units) -> int:
    """Wrap every unit's forward in a non-reentrant checkpoint; returns how many were wrapped."""
    for unit in units.modules:
        forward = unit.forward

        @functools.wraps(forward)
        def checkpointed(*args, _forward=forward, **kwargs):
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        unit.forward = checkpointed
    return len(units.modules)
