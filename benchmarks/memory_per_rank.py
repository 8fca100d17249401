"""Memory of the sharded strategies, measured as a user meets it: `python train.py ...` run inside
a cgroup of its own (benchmarks/cgroup.py).

Parts (each writes benchmarks/results/memory_<part>.md):

- `peaks`: GPT, fp32, AdamW, batch 4 x 128 tokens, 3 steps, at 2 and 4 processes, for ddp, fsdp,
  deepspeed_stage_2 and deepspeed_stage_3, with and without activation checkpointing: the whole
  job's peak (cgroup), and per rank (worst rank, from the memory_monitor callback) the training
  peak and the set-up peak above the rank's baseline (torch and the data loaded, before the model
  is built), next to `framework plan`'s estimate for the same run.
- `cap`: the ~85M GPT at 2 processes with the whole job capped at 3300 MiB.
- `mesh`: ddp, fsdp, hsdp (2x2) and model_parallel (2x2, sequence parallel) at 4 processes, the
  same micro-batch per data-parallel rank: per-rank peaks and step time.
- `largest`: the most layers (n_embd 768) that train 5 steps with each worker process capped at
  2.5 GiB (a cgroup of its own; pages it shares with the process it was forked from are not its
  own), per strategy, at 2 and 4 processes; in steps of 8 layers, then 4 past the last that fits.
  Besides strategy names, the cases of LARGEST_CASES (pipeline stages: `--strategies
  fsdp,pipeline,pipeline_x_fsdp --devices 4`); the last column is against the first strategy.

    .venv/bin/python benchmarks/memory_per_rank.py [peaks|cap|largest ...] [--strategies ddp,fsdp]
                                                         (as root; tens of minutes)
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cgroup  # noqa: E402
from results_table import publish  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MiB, GiB = 2**20, 2**30
SUBSET_SUFFIX = ""  # a run of some strategies only publishes to its own results file
STRATEGIES = ["ddp", "fsdp", "deepspeed_stage_2", "deepspeed_stage_3"]
SIZES = {"85M": ["model.n_layer=12", "model.n_embd=768", "model.n_head=12"],
         "~100M": ["model.n_layer=14", "model.n_embd=768", "model.n_head=12"],
         "~400M": ["model.n_layer=32", "model.n_embd=1024", "model.n_head=16"]}
RUN = ["model.block_size=128", "model.dropout=0.0", "data.batch_size=4", "data.val_batch_size=4",
       "data.max_bytes=300000", "trainer.val_at_start=false", "trainer.val_every=1000",
       "trainer.val_batches=1", "trainer.log_every=1", "trainer.progress_bar=false", "logger=null",
       "callbacks=[memory_monitor]", "trainer.clip_grad_norm=null"]


def train(workdir: Path, strategy: str, devices: int, model: list[str], extra=(), cap=None, worker_cap=None,
          steps=3, run=RUN) -> dict:
    out = workdir / f"run{len(list(workdir.iterdir()))}"
    command = [sys.executable, str(ROOT / "train.py"), f"strategy={strategy}", f"devices={devices}", *model, *run,
               f"trainer.max_steps={steps}", *extra, f"hydra.run.dir={out}"]
    result = cgroup.run(command, cap_bytes=cap, cwd=workdir, worker_cap_bytes=worker_cap)
    row = {"ok": result.returncode == 0, "job_peak": result.peak_bytes, "oom": result.oom_killed, "out": out,
           "seconds": result.seconds, "tail": result.stderr[-1500:], "worker_peaks": result.worker_peaks}
    if row["ok"]:
        ranks = json.loads((out / "memory.json").read_text())["ranks"]
        row["train"] = max(r["train_peak_rss_bytes"] - r["baseline_rss_bytes"] for r in ranks)
        row["setup"] = max(r["setup_peak_rss_bytes"] - r["baseline_rss_bytes"] for r in ranks)
    return row


def planned(strategy: str, devices: int, model: list[str], extra=()) -> float:
    """`framework plan`'s total bytes per rank for the same run (model states and activations)."""
    text = subprocess.run([sys.executable, "-m", "framework", "plan", f"strategy={strategy}", f"devices={devices}",
                           *model, *RUN, "trainer.max_steps=3", *extra],
                          capture_output=True, text=True, cwd=ROOT).stdout
    line = next(row for row in text.splitlines() if row.strip().startswith("total per rank:"))
    value, unit = line.split(":")[-1].split(" on ")[0].split()
    return float(value) * {"KiB": 2**10, "MiB": MiB, "GiB": GiB}[unit]


def peaks(workdir: Path, strategies=STRATEGIES) -> None:
    lines = ["GPT, fp32, AdamW, batch 4 x 128 tokens, 3 steps, CPU (gloo). Per rank: worst rank, above its baseline "
             "(torch and data loaded). Whole job: the cgroup's peak (every process, page cache it brought in).", "",
             "| model | N | strategy | act. ckpt | whole job (MiB) | training peak / rank (MiB) | vs ddp "
             "| set-up peak / rank (MiB) | plan estimate / rank (MiB) | measured / estimate |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for size in ("~100M", "~400M"):
        ddp_train = None  # a ddp rank holds the same at any N: the first ddp row of the size is the reference
        for n in (2, 4):
            for ac in (False, True):
                for strategy in strategies:
                    if (size == "~400M" and ac) or (strategy == "deepspeed_stage_2" and (ac or size == "~400M")):
                        continue  # a 400M step is slow here: the headline strategies only
                    cap = 22 * GiB  # never let the machine itself run out
                    extra = [f"trainer.activation_checkpointing={ac}"]
                    row = train(workdir, strategy, n, SIZES[size], extra, cap)
                    estimate = planned(strategy, n, SIZES[size], extra)
                    if not row["ok"]:
                        why = "killed at the 22 GiB guard" if row["oom"] else "failed"
                        lines.append(f"| {size} | {n} | {strategy} | {ac} | {row['job_peak'] / MiB:.0f} | {why} "
                                     f"| | | {estimate / MiB:.0f} | |")
                    else:
                        if strategy == "ddp" and not ac and ddp_train is None:
                            ddp_train = row["train"]
                        ratio = f"{row['train'] / ddp_train:.2f}x" if ddp_train else ""
                        lines.append(f"| {size} | {n} | {strategy} | {ac} | {row['job_peak'] / MiB:.0f} | "
                                     f"{row['train'] / MiB:.0f} | {ratio} | {row['setup'] / MiB:.0f} | "
                                     f"{estimate / MiB:.0f} | {row['train'] / estimate:.2f} |")
                    print(lines[-1], flush=True)
    publish("memory_peaks" + SUBSET_SUFFIX, lines)


def cap(workdir: Path, strategies=("ddp", "fsdp", "deepspeed_stage_3")) -> None:
    limit = 3300 * MiB
    lines = [f"GPT 85M (n_layer 12, n_embd 768), fp32, 2 processes, the whole job capped at {limit // MiB} MiB "
             "(cgroup memory.limit_in_bytes), 3 steps.", "",
             "| strategy | result | whole-job peak (MiB) |", "|---|---|---|"]
    for strategy in strategies:
        row = train(workdir, strategy, 2, SIZES["85M"], cap=limit)
        result = "trains 3 steps" if row["ok"] else ("killed: out of memory" if row["oom"] else "failed")
        lines.append(f"| {strategy} | {result} | {row['job_peak'] / MiB:.0f} |")
        print(lines[-1], flush=True)
    publish("memory_cap" + SUBSET_SUFFIX, lines)


# the `largest` part's cases beyond a strategy's name: {label: (strategy, its keys)} (model_parallel:
# the 2-D mesh of the mesh part; pipeline: a stage per rank; pipeline_x_fsdp: 2 stages x FSDP2 over the rest)
LARGEST_CASES = {"model_parallel": ("model_parallel", ["strategy.tensor_parallel_size=2", "strategy.sequence_parallel=true"]),
                 "pipeline": ("pipeline", []),
                 "pipeline_x_fsdp": ("pipeline", ["strategy.pipeline_parallel_size=2"])}


def largest(workdir: Path, strategies=("ddp", "fsdp", "deepspeed_stage_3"), devices=(2, 4),
            layers=(8, 16, 24, 32, 40, 48, 56)) -> None:
    per_process = 2.5 * GiB
    layers = list(layers)
    lines = [f"GPT, n_embd 768, fp32, batch 4 x 128 tokens: the most layers that train 5 steps with each worker "
             f"process capped at {per_process / GiB:.1f} GiB (a cgroup of its own; tried {layers}, then 4 more "
             "than the last that trained). Worker peak: the most any worker's group used in that run.", "",
             f"| N | strategy | most layers | parameters | worker peak (MiB) | vs {strategies[0]} |",
             "|---|---|---|---|---|---|"]

    def fits(label: str, n: int, n_layer: int) -> dict | None:
        model = [f"model.n_layer={n_layer}", "model.n_embd=768", "model.n_head=12"]
        strategy, extra = LARGEST_CASES.get(label, (label, []))
        row = train(workdir, strategy, n, model, extra, worker_cap=per_process, steps=5)
        if row["ok"] and len(row["worker_peaks"]) != n:
            sys.exit(f"memory_per_rank: {len(row['worker_peaks'])} worker groups for {n} workers")
        return row if row["ok"] else None

    for n in devices:
        best_first = None  # the first strategy's: the reference of the last column
        for strategy in strategies:
            best, best_row, tried = 0, None, set()
            for n_layer in layers:
                tried.add(n_layer)
                row = fits(strategy, n, n_layer)
                if row is None:
                    break
                best, best_row = n_layer, row
            if best and best < layers[-1] and best + 4 not in tried:
                row = fits(strategy, n, best + 4)
                if row is not None:
                    best, best_row = best + 4, row
            params = best * 7_087_872 + 295_680 if best else 0
            best_first = best if strategy == strategies[0] else best_first
            ratio = f"{best / best_first:.2f}x" if best_first else ""
            peak = f"{max(best_row['worker_peaks']) / MiB:.0f}" if best_row else ""
            lines.append(f"| {n} | {strategy} | {best} | {params / 1e6:.0f}M | {peak} | {ratio} |")
            print(lines[-1], flush=True)
    publish("memory_largest" + SUBSET_SUFFIX, lines)


MESHES = {"ddp": ("ddp", []), "fsdp": ("fsdp", []), "hsdp": ("hsdp", ["strategy.shard_size=2"]),
          "model_parallel (no SP)": ("model_parallel", ["strategy.tensor_parallel_size=2"]),
          "model_parallel": ("model_parallel", ["strategy.tensor_parallel_size=2", "strategy.sequence_parallel=true"])}
# benchmarks/mesh_probe.py on every rank: the largest unit gathered at once and the activations kept for backward
PROBE = ["+callbacks.probe._target_=mesh_probe.MeshProbe", "trust.allow=[mesh_probe.]"]


def mesh(workdir: Path, strategies=tuple(MESHES)) -> None:
    """The 2-D strategies at 4 processes beside ddp and fsdp, at the same micro-batch per
    data-parallel rank, plus the step time (the median of steps 2-4: these ranks share 2 cores)."""
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent),
                                                             os.environ.get("PYTHONPATH")]))
    lines = ["GPT ~100M (n_layer 14, n_embd 768), fp32, AdamW, 4 processes, micro-batch 4 x 128 tokens per "
             "data-parallel rank, 4 steps, CPU (gloo). hsdp: 2 replicas x 2 shards; model_parallel: 2 data-parallel x "
             "2 tensor-parallel ranks, with sequence parallelism (SP) unless said. Per rank: worst rank, above its "
             "baseline. Largest gathered unit: the biggest FSDP unit's own parameters at their gathered size, from "
             "the live sharded model; activations: what one training forward keeps for backward (parameters left "
             "out), counted with saved-tensor hooks (benchmarks/mesh_probe.py).", "",
             "| strategy | training peak / rank (MiB) | vs fsdp | largest gathered unit (MiB) | vs fsdp "
             "| activations / rank (MiB) | vs fsdp | set-up peak / rank (MiB) | whole job (MiB) | step (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    rows = {}
    for label in strategies:
        strategy, extra = MESHES[label]
        row = train(workdir, strategy, 4, SIZES["~100M"], [*extra, *PROBE, "logger=csv"], cap=22 * GiB, steps=4)
        if row["ok"]:
            probes = [json.loads(f.read_text()) for f in sorted(row["out"].glob("probe_rank*.json"))]
            row.update(unit=max(p["largest_unit_bytes"] for p in probes),
                       saved=max(p["saved_activation_bytes"] for p in probes), step=_median_step(row["out"]))
        rows[label] = row
        print(label, {k: row.get(k) for k in ("ok", "train", "unit", "saved", "step")}, flush=True)
    fsdp = rows.get("fsdp") if rows.get("fsdp", {}).get("ok") else None
    for label, row in rows.items():
        if not row["ok"]:
            lines.append(f"| {label} | {'killed at the 22 GiB guard' if row['oom'] else 'failed'} | | | | | | | "
                         f"{row['job_peak'] / MiB:.0f} | |")
            print(row["tail"][-400:], flush=True)
            continue

        def vs(key: str, row=row) -> str:
            return f"{row[key] / fsdp[key]:.2f}x" if fsdp and fsdp[key] and row[key] else ""

        unit = f"{row['unit'] / MiB:.1f}" if row["unit"] else "none (the whole model)"
        lines.append(f"| {label} | {row['train'] / MiB:.0f} | {vs('train')} | {unit} | {vs('unit')} | "
                     f"{row['saved'] / MiB:.0f} | {vs('saved')} | {row['setup'] / MiB:.0f} | "
                     f"{row['job_peak'] / MiB:.0f} | {row['step']:.2f} |")
    publish("memory_mesh" + SUBSET_SUFFIX, lines)


def step_seconds(out: Path) -> list[float]:
    """Seconds of each logged step of a run logged every step, from the tokens/s in its metrics.csv
    (the first includes what came before the first step: compilation, for a compiled run)."""
    rows = [r for r in csv.DictReader(open(out / "metrics.csv")) if r.get("train/tokens_per_s")]
    return [float(rows[0]["train/tokens"]) / float(r["train/tokens_per_s"]) for r in rows]


def _median_step(out: Path) -> float:
    """The median seconds per step after the first."""
    per_step = step_seconds(out)[1:]
    return statistics.median(per_step) if per_step else float("nan")


def main() -> None:
    why = cgroup.available()
    if why:
        sys.exit(f"memory_per_rank: {why}")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", default=["peaks", "cap", "largest"],
                        choices=["peaks", "cap", "largest", "mesh"])
    parser.add_argument("--strategies", help="comma-separated subset to measure again (keep ddp: the reference); "
                        "published to results files of their own (memory_peaks_<strategies>.md, ...)")
    parser.add_argument("--devices", help="largest: comma-separated process counts (default 2,4)")
    parser.add_argument("--layers", help="largest: comma-separated layer counts to try, in order (default 8,16,...,56)")
    args = parser.parse_args()
    chosen = {"strategies": args.strategies.split(",")} if args.strategies else {}
    largest_options = {**({"devices": [int(n) for n in args.devices.split(",")]} if args.devices else {}),
                       **({"layers": [int(n) for n in args.layers.split(",")]} if args.layers else {})}
    global SUBSET_SUFFIX
    SUBSET_SUFFIX = "_" + args.strategies.replace(",", "_") if args.strategies else ""
    with tempfile.TemporaryDirectory() as tmp:
        for part in args.parts or ["peaks", "cap", "largest"]:
            options = {**chosen, **largest_options} if part == "largest" else chosen
            {"peaks": peaks, "cap": cap, "largest": largest, "mesh": mesh}[part](Path(tmp), **options)


if __name__ == "__main__":
    main()
