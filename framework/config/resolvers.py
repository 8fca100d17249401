"""OmegaConf resolvers the shipped configs use."""
from __future__ import annotations

import functools
import json
import os
import sysconfig
import time
from pathlib import Path

from omegaconf import OmegaConf

from framework.errors import ConfigError


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


BYTES = "bytes"
BYTE_VOCAB = 256


def tokenizer_file(tokenizer: str) -> Path:
    """tokenizer.json itself, or the directory that holds it (a Hugging Face tokenizer directory)."""
    path = Path(str(tokenizer)).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(f"data.tokenizer={tokenizer!r}: no such tokenizer.json (give the file, a directory holding "
                          f"it, or {BYTES!r} for byte-level tokens that need no file).")
    return path


@functools.lru_cache(maxsize=None)
def vocab_size(tokenizer: str) -> int:
    """`${vocab_size:${data.tokenizer}}`: the number of token ids a tokenizer makes (256 for bytes),
    read from tokenizer.json (its vocabulary and added tokens) without loading a tokenizer library,
    so a model's embedding follows the data's tokenizer in YAML."""
    if str(tokenizer) == BYTES:
        return BYTE_VOCAB
    path = tokenizer_file(tokenizer)
    try:
        spec = json.loads(path.read_text())
        vocab = spec["model"]["vocab"]
        ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
        ids += [t["id"] for t in spec.get("added_tokens") or []]
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"data.tokenizer={tokenizer!r}: {path} is not a tokenizer.json ({err}).") from err
    return max(ids) + 1


def tokenizer_of(pretrained) -> str:
    """`${tokenizer_of:${oc.select:model.pretrained,null}}`: a pretrained model directory's own
    tokenizer where it holds one (the default of data.tokenizer, so a fine-tune reads text with
    the tokens its base was trained on), else bytes."""
    if pretrained and (Path(str(pretrained)).expanduser() / "tokenizer.json").is_file():
        return str(Path(str(pretrained)).expanduser())
    return BYTES


def stdlib_dir() -> str:
    """`${stdlib_dir:}`: the Python standard library's folder, text every machine has."""
    return sysconfig.get_paths()["stdlib"]


def example_data(name: str) -> str:
    """`${example_data:stdlib_chat.jsonl}`: a data file that ships with the framework
    (framework/data/examples)."""
    path = Path(__file__).resolve().parent.parent / "data" / "examples" / str(name)
    if not path.is_file():
        raise ConfigError(f"${{example_data:{name}}}: the framework ships no such example "
                          f"(it has {', '.join(sorted(p.name for p in path.parent.glob('*.jsonl')))}).")
    return str(path)


def register() -> None:
    if not OmegaConf.has_resolver("job_name"):
        OmegaConf.register_new_resolver("job_name", job_name, use_cache=True)
    if not OmegaConf.has_resolver("vocab_size"):
        OmegaConf.register_new_resolver("vocab_size", vocab_size)
    if not OmegaConf.has_resolver("tokenizer_of"):
        OmegaConf.register_new_resolver("tokenizer_of", tokenizer_of)
    if not OmegaConf.has_resolver("stdlib_dir"):
        OmegaConf.register_new_resolver("stdlib_dir", stdlib_dir)
    if not OmegaConf.has_resolver("example_data"):
        OmegaConf.register_new_resolver("example_data", example_data)
