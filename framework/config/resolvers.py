"""OmegaConf resolvers the shipped configs use."""
from __future__ import annotations

import functools
import os
import time

from omegaconf import OmegaConf


@functools.lru_cache(maxsize=1)
def job_name() -> str:
    """The default run name. Processes a scheduler or launcher started together must agree on
    their run directory without talking, so there it is the job's id (SLURM, LSF, Open MPI/PMIx,
    torchrun; a requeued SLURM job keeps its id, so it finds its own checkpoints again);
    otherwise the start time (the same for every call in this process). Nodes of a multi-node
    torchrun without --rdzv-id have no common id: give them name=... ."""
    env = os.environ
    if env.get("SLURM_JOB_ID") and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
            return f"slurm-{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
        return f"slurm-{env['SLURM_JOB_ID']}"
    if env.get("LSB_JOBID"):
        return f"lsf-{env['LSB_JOBID']}"
    mpi_job = env.get("OMPI_MCA_ess_base_jobid") or env.get("PMIX_NAMESPACE")  # Open MPI / PMIx launchers
    if mpi_job:
        return f"mpi-{mpi_job}"
    run_id = env.get("TORCHELASTIC_RUN_ID", "none")
    if run_id and run_id != "none":  # torchrun --standalone, or --rdzv-id
        return f"torchrun-{run_id}"
    return time.strftime("%Y-%m-%d/%H-%M-%S")


def register() -> None:
    if not OmegaConf.has_resolver("job_name"):
        OmegaConf.register_new_resolver("job_name", job_name, use_cache=True)
