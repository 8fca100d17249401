"""`fault_tolerance=none` (the default): one lost process stops every rank; the run restarts from
its last checkpoint (resume=auto, the elastic agent's trainer.max_restarts)."""
from __future__ import annotations

from framework.fault_tolerance.base import FaultTolerance


class NoFaultTolerance(FaultTolerance):
    """The run is one replica group."""
