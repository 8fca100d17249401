"""`framework eval RUN --tasks NAMES [--include-path DIR] [--limit N] [--num-fewshot K] [--batch-size B]`:
the benchmarks people compare models by, through EleutherAI's lm-evaluation-harness.

RUN is a run directory (its best checkpoint, else its newest, as `framework test` chooses), a
checkpoint directory, or a Hugging Face directory (what `framework convert --to hf` writes). The
harness does the evaluation: its task registry (or local YAML task files with `--include-path`),
prompts, few-shot examples, metrics and aggregation. The framework supplies the model:
- a Hugging Face family with a Hugging Face tokenizer goes through the harness's own `hf` model
  class, on the run exported as `framework convert --to hf` exports it (adapters merged), so the
  scores are those of `lm-eval run --model hf` on that export;
- any other model (the built-in GPT, a model on bytes) through the framework's own
  (framework/generation/harness.py): log-likelihoods, rolling log-likelihoods and greedy generation.
It runs in one process (the harness's data-parallel evaluation needs Accelerate's launcher).
Results: eval_metrics.json beside the run (the harness's version, each task's version and shots,
the checkpoint and its step), a table, and a row of the run's loggers at the checkpoint's step.
Nothing is downloaded for a local task file; a registry task's data set is fetched by the harness
(`datasets`) the first time unless it is in the Hugging Face cache.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import tempfile
from pathlib import Path

from omegaconf import OmegaConf

from framework.checkpoint.format import read_meta
from framework.checkpoint.load import find_checkpoint
from framework.cli.convert import export_hub_directory
from framework.errors import ConfigError, ExitCode, UserError, report
from framework.generation.harness import harness_model
from framework.generation.load import is_hub_directory, load_model, run_config
from framework.models.hf_causal_lm import is_hub_model
from framework.modes import log_to_run
from framework.results import metrics_table, write_json

COMMAND = "framework eval"
EVAL_METRICS = "eval_metrics.json"
EXTRA = "pip install 'framework[eval]'"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=COMMAND, description="benchmarks through lm-evaluation-harness")
    p.add_argument("target", help="a run directory (its best checkpoint), a checkpoint directory or a Hugging Face "
                                  "directory")
    p.add_argument("--tasks", required=True, help="comma-separated task names (the harness's, or --include-path's)")
    p.add_argument("--include-path", help="a directory of the harness's YAML task files (local data: nothing fetched)")
    p.add_argument("--limit", type=float, default=None, help="at most N examples per task (below 1: a share)")
    p.add_argument("--num-fewshot", type=int, default=None, help="examples in each prompt (default: the task's)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0, help="the harness's random seeds (few-shot sampling)")
    return p


def _harness():
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError as err:
        raise ConfigError(f"{COMMAND} needs EleutherAI's lm-evaluation-harness, which is not installed ({err}); "
                          f"{EXTRA}.") from None
    return lm_eval, TaskManager


def task_manager(TaskManager, include_path: str | None):
    """The harness's task registry, with the YAML task files of `include_path` (checked)."""
    if include_path is None:
        return TaskManager()
    path = Path(include_path).expanduser()
    if not path.is_dir():
        raise ConfigError(f"--include-path {include_path}: no such directory; give the directory of your YAML task "
                          "files.")
    if not any(path.rglob("*.yaml")):
        raise ConfigError(f"--include-path {include_path}: holds no YAML task file (*.yaml, the harness's task "
                          "format: task, dataset_path, output_type, doc_to_text, ...); add one, or drop the option.")
    return TaskManager(include_path=str(path))


def chosen_tasks(manager, tasks: str, include_path: str | None) -> list[str]:
    names = [name.strip() for name in tasks.split(",") if name.strip()]
    known = set(manager.all_tasks)
    unknown = [name for name in names if name not in known]
    if not names or unknown:
        raise ConfigError(f"--tasks {tasks}: {', '.join(unknown) or 'no task'} is no task of the harness"
                          f"{' nor of --include-path ' + include_path if include_path else ''}; list them with "
                          "`lm-eval ls tasks` (with --include_path DIR for local files), or name a local task "
                          "file's `task:`.")
    return names


def _model(target: Path, batch_size: int, device: str, scratch: Path):
    """(the harness model, what was loaded, where the results go, the checkpoint, its step, the run's config)."""
    if is_hub_directory(target):
        return _hub(target, batch_size, device), f"{target} (Hugging Face directory)", target, None, None, None
    checkpoint, run_dir, why = find_checkpoint(target, COMMAND)
    config = run_config(checkpoint, run_dir)
    step = read_meta(checkpoint).get("step")
    tokenizer = (config.get("data") or {}).get("tokenizer")
    out = run_dir or checkpoint.parent
    if is_hub_model(config.get("model") or {}) and tokenizer and (Path(str(tokenizer)) / "tokenizer.json").is_file():
        exported = export_hub_directory(checkpoint, scratch / "hf")  # adapters merged, the run's tokenizer with it
        return _hub(exported, batch_size, device), f"{checkpoint} ({why}), exported", out, checkpoint, step, config
    loaded = load_model(target, COMMAND, device=device)
    return harness_model(loaded, batch_size, device), loaded.source, out, checkpoint, step, config


def _hub(directory: Path, batch_size: int, device: str):
    """The harness's own Hugging Face model class on a from_pretrained directory with its tokenizer
    (without one, load_model says what is missing)."""
    from lm_eval.models.huggingface import HFLM

    if not (directory / "tokenizer.json").is_file():
        return harness_model(load_model(directory, COMMAND, device=device), batch_size, device)
    return HFLM(pretrained=str(directory), tokenizer=str(directory), batch_size=batch_size, device=device,
                dtype="float32")


def scores(results: dict) -> tuple[dict[str, float], dict]:
    """(flat metrics eval/<task>/<metric> for the loggers, per task: its version, shots and metrics)."""
    flat, tasks = {}, {}
    for task, values in results["results"].items():
        kept = {name.split(",")[0]: float(value) for name, value in values.items()  # "acc,none": metric, filter
                if "," in name and "_stderr" not in name and isinstance(value, (int, float))
                and not isinstance(value, bool)}
        tasks[task] = {"version": results.get("versions", {}).get(task), "n-shot": results.get("n-shot", {}).get(task),
                       "metrics": kept}
        flat.update({f"eval/{task}/{name}": value for name, value in kept.items()})
    return flat, tasks


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        try:
            lm_eval, TaskManager = _harness()
            manager = task_manager(TaskManager, args.include_path)
            names = chosen_tasks(manager, args.tasks, args.include_path)
            model, source, out, checkpoint, step, config = _model(Path(args.target).expanduser(), args.batch_size,
                                                                   args.device, Path(scratch))
        except UserError as err:
            report(err)
            return ExitCode.USER_ERROR
        print(f"{COMMAND}: {source}; tasks {', '.join(names)}", flush=True)
        limit = None if args.limit is None else (int(args.limit) if args.limit >= 1 else args.limit)
        results = lm_eval.simple_evaluate(model=model, tasks=names, num_fewshot=args.num_fewshot, limit=limit,
                                          task_manager=manager, log_samples=False, random_seed=args.seed,
                                          numpy_random_seed=args.seed, torch_random_seed=args.seed,
                                          fewshot_random_seed=args.seed)
    flat, tasks = scores(results)
    record = {"lm_eval": importlib.metadata.version("lm_eval"), "source": source,
              "checkpoint": str(checkpoint) if checkpoint else None, "step": step, "limit": args.limit,
              "num_fewshot": args.num_fewshot, "tasks": tasks}
    path = write_json(out / EVAL_METRICS, record)
    print(metrics_table({k.removeprefix("eval/"): v for k, v in flat.items()}, f"{COMMAND}: {path}"), flush=True)
    if config is not None and (out / "config.yaml").is_file():  # a run directory: its loggers
        log_to_run(OmegaConf.create(config), out, flat, step)
    return ExitCode.OK
