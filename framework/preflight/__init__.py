"""Preflight: every check a run passes before any process starts or any device is touched, in one
pipeline that `python train.py`, `framework validate`, `framework plan`, `test` and `predict` all
go through (`prepare`): the config resolved, its values and targets checked, the plugins built,
the model built on the meta device, the data and task built and passed one example batch, the
combination judged by the compatibility table, the monitored metrics checked, and the run's
memory compared with the machine's.

- prepared.py: `prepare` and what it returns (`Prepared`: the problems, or what was built);
- components.py: model, data and task built and tried together; what testing needs of the data;
- monitors.py: the metrics settings name must be ones a validation logs;
- memory.py: what `framework plan` estimated, said when a worker runs out of memory.
"""
from framework.preflight.prepared import Prepared, compatibility_plan, prepare

__all__ = ["Prepared", "compatibility_plan", "prepare"]
