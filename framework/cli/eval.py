"""`framework eval RUN --tasks NAMES [--include-path DIR] [--limit N] [--num-fewshot K] [--batch-size B]
[--device D] [--dtype T] [--seed S]`: the benchmarks people compare models by, through EleutherAI's
lm-evaluation-harness.

RUN is a run directory (its best checkpoint, else its newest, as `framework test` chooses), a
checkpoint directory, or a Hugging Face directory (what `framework convert --to hf` writes). The
harness does the evaluation: its task registry (or local YAML task files with `--include-path`),
prompts, few-shot examples, metrics and aggregation. The framework supplies the model:
- a Hugging Face family with a Hugging Face tokenizer goes through the harness's own `hf` model
  class, on the run exported as `framework convert --to hf` exports it (adapters merged), so the
  scores are those of `lm-eval run --model hf` on that export;
- any other model (the built-in GPT, a model on bytes) through the framework's own
  (framework/generation/harness.py): log-likelihoods, rolling log-likelihoods and greedy generation.
It runs in one process (the harness's data-parallel evaluation needs Accelerate's launcher), on
the device and in the dtype the run trained with (its accelerator where that device is here, its
precision's compute dtype) unless --device / --dtype say otherwise.
Results: eval_metrics.json beside the run (the harness's version, each task's version and shots,
the checkpoint and its step; every evaluation also appended to eval_history.jsonl), a table, and
the run's loggers at the checkpoint's step, named `eval/<task>/<metric>` (with `/<K>-shot` and
`/limit-<N>` after the task where --num-fewshot or --limit is given, so a second evaluation with
other settings at the same step adds its own columns instead of replacing the first's).
Nothing is downloaded for a local task file; a registry task's data set is fetched by the harness
(`datasets`) the first time unless it is in the Hugging Face cache.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import tempfile
from pathlib import Path

import torch
from omegaconf import OmegaConf

from framework.checkpoint.format import read_meta
from framework.checkpoint.load import find_checkpoint
from framework.cli.convert import export_hub_directory
from framework.cli.eval_tasks import chosen_tasks, task_manager
from framework.config.build import build
from framework.errors import ConfigError, ExitCode, UserError, report
from framework.generation.harness import harness_model
from framework.generation.load import is_hub_directory, load_model, quantizing_precision, run_config
from framework.models.hf_causal_lm import is_hub_model
from framework.modes import log_to_run
from framework.results import metrics_table, write_json

COMMAND = "framework eval"
EVAL_METRICS = "eval_metrics.json"
EXTRA = "pip install 'framework[eval]'"


EVAL_HISTORY = "eval_history.jsonl"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
# lm-eval's own defaults for its four seeds (python random, numpy, torch, few-shot sampling): `lm-eval run`
# without --seed samples the same few-shot examples as `framework eval` without it
HARNESS_SEEDS = (0, 1234, 1234, 1234)


def _limit(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or (value >= 1 and value != int(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number of examples (a whole number, 1 or more) nor "
                                         "a share of each task (between 0 and 1, e.g. 0.1); give one, or drop --limit "
                                         "to score every example")
    return value


def _count(least: int, what: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of {least} or more ({what})")
        return value
    return parse


def _seeds(text: str) -> tuple[int, int, int, int]:
    """lm-eval's --seed: one integer for all four seeds, or four comma-separated (random, numpy,
    torch, few-shot)."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) not in (1, 4):
        raise argparse.ArgumentTypeError(f"{text!r}: give one integer for every seed, or four comma-separated "
                                         "(python random, numpy, torch, few-shot sampling), as lm-eval's --seed")
    return tuple(values * 4 if len(values) == 1 else values)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=COMMAND, description="benchmarks through lm-evaluation-harness")
    p.add_argument("target", help="a run directory (its best checkpoint), a checkpoint directory or a Hugging Face "
                                  "directory")
    p.add_argument("--tasks", required=True, help="comma-separated task names (the harness's, or --include-path's)")
    p.add_argument("--include-path", help="a directory of the harness's YAML task files (local data: nothing fetched)")
    p.add_argument("--limit", type=_limit, default=None, help="at most N examples per task (between 0 and 1: a share)")
    p.add_argument("--num-fewshot", type=_count(0, "examples in each prompt"), default=None,
                   help="examples in each prompt (default: the task's)")
    p.add_argument("--batch-size", type=_count(1, "requests a forward scores"), default=8)
    p.add_argument("--device", default=None, help="where the model runs (default: the run's accelerator where it is "
                                                   "here, else cpu)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="the weights' dtype (default: the run's precision's compute dtype; float32 for a Hugging Face "
                        "directory)")
    p.add_argument("--seed", type=_seeds, default=HARNESS_SEEDS,
                   help="the harness's seeds, as lm-eval's --seed: one integer or four comma-separated (default: "
                        "lm-eval's own, 0,1234,1234,1234)")
    return p


def run_device(config: dict | None) -> str:
    """The run's accelerator where it is on this machine (cuda, mps), else the CPU."""
    target = str(((config or {}).get("accelerator") or {}).get("_target_", ""))
    if target.endswith(("cuda.CUDAAccelerator", "auto.auto_accelerator")) and torch.cuda.is_available():
        return "cuda"
    if target.endswith("mps.MPSAccelerator") and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def run_dtype(config: dict | None) -> str:
    """The dtype the run kept its weights in: its precision plugin's parameter dtype (bf16_true:
    bfloat16, 16_true: float16, 64: float64; the mixed ones, bf16 and 16, keep float32 weights and
    so do the quantized ones' other layers)."""
    node = (config or {}).get("precision") or {}
    if not str(node.get("_target_", "")).startswith("framework.precision.") or quantizing_precision(config):
        return "float32"
    try:
        dtype = build(node, "precision").param_dtype
    except (UserError, AttributeError):
        return "float32"
    return next((key for key, value in DTYPES.items() if value == dtype), "float32")


def _harness():
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError as err:
        raise ConfigError(f"{COMMAND} needs EleutherAI's lm-evaluation-harness, which is not installed ({err}); "
                          f"{EXTRA}.") from None
    return lm_eval, TaskManager


def _model(target: Path, args, scratch: Path):
    """(the harness model, what was loaded, where the results go, the checkpoint, its step, the run's
    config); args.device and args.dtype filled with the run's where not given."""
    if is_hub_directory(target):
        args.device, args.dtype = args.device or run_device(None), args.dtype or "float32"
        return _hub(target, args), f"{target} (Hugging Face directory)", target, None, None, None
    checkpoint, run_dir, why = find_checkpoint(target, COMMAND)
    config = run_config(checkpoint, run_dir)
    args.device, args.dtype = args.device or run_device(config), args.dtype or run_dtype(config)
    step = read_meta(checkpoint).get("step")
    tokenizer = (config.get("data") or {}).get("tokenizer")
    out = run_dir or checkpoint.parent
    if is_hub_model(config.get("model") or {}) and tokenizer and (Path(str(tokenizer)) / "tokenizer.json").is_file():
        exported = export_hub_directory(checkpoint, scratch / "hf")  # adapters merged, the run's tokenizer with it
        return _hub(exported, args), f"{checkpoint} ({why}), exported", out, checkpoint, step, config
    loaded = load_model(target, COMMAND, device=args.device, dtype=DTYPES[args.dtype])
    return harness_model(loaded, args.batch_size, args.device), loaded.source, out, checkpoint, step, config


def _hub(directory: Path, args):
    """The harness's own Hugging Face model class on a from_pretrained directory with its tokenizer
    (without one, load_model says what is missing)."""
    from lm_eval.models.huggingface import HFLM

    if not (directory / "tokenizer.json").is_file():
        loaded = load_model(directory, COMMAND, device=args.device, dtype=DTYPES[args.dtype])
        return harness_model(loaded, args.batch_size, args.device)
    return HFLM(pretrained=str(directory), tokenizer=str(directory), batch_size=args.batch_size, device=args.device,
                dtype=args.dtype)


def metric_prefix(task: str, num_fewshot: int | None, limit: float | None) -> str:
    """`eval/<task>`, then `/<K>-shot` and `/limit-<N>` where they were asked for: an evaluation with
    other settings is another measurement, logged beside the first at the same step."""
    prefix = f"eval/{task}"
    if num_fewshot is not None:
        prefix += f"/{num_fewshot}-shot"
    if limit is not None:
        prefix += f"/limit-{int(limit) if limit >= 1 else limit}"
    return prefix


def scores(results: dict, num_fewshot: int | None = None, limit: float | None = None) -> tuple[dict[str, float], dict]:
    """(flat metrics eval/<task>[/<K>-shot][/limit-<N>]/<metric> for the loggers, per task: its
    version, shots and metrics)."""
    flat, tasks = {}, {}
    for task, values in results["results"].items():
        kept = {name.split(",")[0]: float(value) for name, value in values.items()  # "acc,none": metric, filter
                if "," in name and "_stderr" not in name and isinstance(value, (int, float))
                and not isinstance(value, bool)}
        tasks[task] = {"version": results.get("versions", {}).get(task), "n-shot": results.get("n-shot", {}).get(task),
                       "metrics": kept}
        prefix = metric_prefix(task, num_fewshot, limit)
        flat.update({f"{prefix}/{name}": value for name, value in kept.items()})
    return flat, tasks


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        try:
            lm_eval, TaskManager = _harness()
            manager = task_manager(TaskManager, args.include_path)
            names = chosen_tasks(manager, args.tasks, args.include_path)
            model, source, out, checkpoint, step, config = _model(Path(args.target).expanduser(), args, Path(scratch))
        except UserError as err:
            report(err)
            return ExitCode.USER_ERROR
        print(f"{COMMAND}: {source}; tasks {', '.join(names)}; on {args.device} in {args.dtype}", flush=True)
        limit = None if args.limit is None else (int(args.limit) if args.limit >= 1 else args.limit)
        random_seed, numpy_seed, torch_seed, fewshot_seed = args.seed
        try:
            results = lm_eval.simple_evaluate(model=model, tasks=names, num_fewshot=args.num_fewshot, limit=limit,
                                              task_manager=manager, log_samples=False, random_seed=random_seed,
                                              numpy_random_seed=numpy_seed, torch_random_seed=torch_seed,
                                              fewshot_random_seed=fewshot_seed)
        except FileNotFoundError as err:  # a data file the harness's loader looked for (a glob matching nothing, ...)
            report(ConfigError(f"--tasks {args.tasks}: a task's data could not be read ({err}); fix the data files "
                               "its YAML names."))
            return ExitCode.USER_ERROR
    flat, tasks = scores(results, args.num_fewshot, limit)
    record = {"lm_eval": importlib.metadata.version("lm_eval"), "source": source,
              "checkpoint": str(checkpoint) if checkpoint else None, "step": step, "limit": args.limit,
              "num_fewshot": args.num_fewshot, "seed": list(args.seed), "device": args.device, "dtype": args.dtype,
              "tasks": tasks}
    path = write_json(out / EVAL_METRICS, record)
    with (out / EVAL_HISTORY).open("a") as history:  # every evaluation kept, the latest also in EVAL_METRICS
        history.write(json.dumps(record) + "\n")
    print(metrics_table({k.removeprefix("eval/"): v for k, v in flat.items()}, f"{COMMAND}: {path}"), flush=True)
    if config is not None and (out / "config.yaml").is_file():  # a run directory: its loggers
        log_to_run(OmegaConf.create(config), out, flat, step)
    return ExitCode.OK
