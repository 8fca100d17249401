"""What a sweep records of itself (`sweep.yaml` in its directory: the command it was started
with), and what a job's name on a dashboard is made of: its swept values, told from that record."""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from framework.config.overrides import defining_overrides

SWEEP_RECORD_FILE = "sweep.yaml"  # the command a sweep was started with (framework/sweeps.py writes it)
SUMMARY_FILE = "summary.json"  # every run's: status, objective, overrides, final metrics
SWEEP_SUMMARY_FILE = "sweep_summary.csv"  # a sweep's, written when it ends


def job_label(run_dir: Path) -> str | None:
    """A sweep job's name for dashboards: its number and the overrides it does not share with the
    sweep's command (the swept values, or what an Optuna sweeper sampled), e.g.
    "3 model.n_embd=32,optimizer.lr=0.003". None for a directory that is not a sweep job (read
    from files, so it works in every process of the job, whoever launched it)."""
    run_dir = Path(run_dir)
    record, overrides = run_dir.parent / SWEEP_RECORD_FILE, run_dir / ".hydra" / "overrides.yaml"
    if not (run_dir.name.isdigit() and record.is_file() and overrides.is_file()):
        return None
    try:
        command = dict(_key_value(o) for o in OmegaConf.load(record).overrides if "=" in o)
        mine = defining_overrides(OmegaConf.load(overrides))
    except Exception:  # an unreadable record: the job keeps its plain name
        return None
    varying = [o for o in mine if _key_value(o)[0] not in command or _is_swept(command[_key_value(o)[0]])]
    return f"{run_dir.name} {','.join(varying)}".strip()[:200]


def _key_value(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


SWEEP_FUNCTIONS = ("range(", "choice(", "interval(", "glob(", "shuffle(", "sort(", "tag(")


def _is_swept(value: str) -> bool:
    """Whether an override's value on a sweep's command line is a sweep (a,b / range(...) / ...),
    not one value (a list like [a,b] is one value)."""
    depth = 0
    for char in value:
        if char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            return True
    return value.strip().startswith(SWEEP_FUNCTIONS)
