"""The metrics a run's settings name (the checkpoint's and early stopping's monitor, the objective)
must be ones its validation logs: else best-checkpoint selection is quietly off and the objective
null."""
from __future__ import annotations

from omegaconf import DictConfig

from framework.errors import did_you_mean

SHIPPED_MONITOR = "val/loss"  # what conf/ sets for the checkpoint's and early stopping's monitor and the objective


def monitor_problems(cfg: DictConfig, logged: set[str] | None) -> tuple[list[str], list[str]]:
    """(refusals, warnings): a validation metric that a setting names (the checkpoint's monitor,
    early stopping's, the objective) must be one the validation logs, else best-checkpoint
    selection is quietly off and the objective null. A name the user chose is refused; the shipped
    default (val/loss) under a task that logs no loss is a warning, so a task of one's own runs
    with the shipped config."""
    if logged is None:  # not known here
        return [], []
    named = {f"callbacks.{name}.monitor": node.get("monitor") for name, node in (cfg.get("callbacks") or {}).items()
             if isinstance(node, DictConfig) and "monitor" in node}
    objective = named["trainer.objective"] = cfg.trainer.get("objective")
    refusals, warnings = [], []
    testing = isinstance(objective, str) and objective.startswith("test/")
    if testing:
        if not cfg.trainer.get("test_at_end"):
            refusals.append(f"trainer.objective={objective!r} is a test metric, logged only when the run tests at its "
                            "end: set trainer.test_at_end=true, or choose a val/ metric.")
        logged = logged | {"test/" + name.split("/", 1)[1] for name in logged}  # test/ scores with the same metrics
    for key, value in named.items():
        if not (isinstance(value, str) and value.startswith(("val/", "test/"))) or value in logged:
            continue
        if not logged:  # the data has no validation split
            message = (f"{key}={value!r} is never logged: the data has no validation split (data.val_percent=0), "
                       f"so the run never validates. Set {key}=null, or hold out a split (data.val_percent above 0, "
                       "or data.val_files).")
        else:
            message = (f"{key}={value!r} is never logged: {'the run' if testing else 'a validation'} logs "
                       f"{', '.join(sorted(logged))}."
                       f"{did_you_mean(value, logged)} Set {key} to one of them.")
        if value == SHIPPED_MONITOR:
            warnings.append(message.replace(" is never logged:", " (the shipped default) is never logged by this "
                                            f"{'task' if logged else 'run'}, so it selects nothing:"))
        else:
            refusals.append(message)
    return refusals, warnings
