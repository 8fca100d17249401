"""Context parallelism as a user meets it: `python train.py ... strategy.context_parallel_size=C`
in a memory cgroup of its own (benchmarks/cgroup.py; needs root and cgroup v1).

Parts (each writes benchmarks/results/context_parallel_<part>.md):

- `probe`: why a step's memory looked non-monotonic in the sequence length (the issue's probe: one
  process, 4 layers x 256, batch 1, 2 steps): the whole job's peak at each block_size with the
  default validation batch (data.val_batch_size 64: up to 64 rows of block_size tokens, under
  no_grad, at the end of training) and with a validation batch of one row.
- `longest`: the longest block_size (doubling from 4096) that trains 2 steps with each process
  capped at CAP (the same model, batch 1, one validation row), at context 1 (one process: the cap
  on the job), 2 and 4 (each worker in a group of its own).
- `speed`: tokens per second at equal tokens per step (batch 1 x 8192), context 1, 2 and 4, from the
  runs' own train/tokens_per_s (steps 2-4; the first step builds caches). On a 2-core machine 4
  processes share 2 cores: the 4-rank figure measures oversubscription as much as the method.

    .venv/bin/python benchmarks/context_parallel.py [probe] [longest] [speed]   (as root; ~15 min)
"""
from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cgroup  # noqa: E402
from results_table import publish  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MiB, GiB = 2**20, 2**30
CAP = 1.5 * GiB
MODEL = ["model.n_layer=4", "model.n_embd=256", "model.n_head=4", "model.dropout=0.0"]
RUN = ["data.batch_size=1", "trainer.progress_bar=false", "trainer.plot=false", "trainer.log_every=1",
       "trainer.val_at_start=false", "trainer.val_batches=1", "trainer.test_at_end=false",
       "callbacks=[]"]


def train(workdir: Path, block: int, context: int, extra=(), steps: int = 2, cap=None, worker_cap=None) -> dict:
    out = workdir / f"run{len(list(workdir.iterdir()))}"
    layout = ["strategy=single_device"] if context == 1 else ["strategy=fsdp", f"devices={context}",
                                                              f"strategy.context_parallel_size={context}"]
    command = [sys.executable, str(ROOT / "train.py"), *MODEL, *RUN, *layout, f"model.block_size={block}",
               f"trainer.max_steps={steps}", *extra, f"hydra.run.dir={out}"]
    result = cgroup.run(command, cap_bytes=cap, cwd=workdir, worker_cap_bytes=worker_cap, timeout=1800)
    row = {"ok": result.returncode == 0, "peak": result.peak_bytes, "oom": result.oom_killed,
           "workers": max(result.worker_peaks, default=0), "tail": result.stderr[-800:], "out": out}
    if row["ok"]:
        rows = [r for r in csv.DictReader(open(out / "metrics.csv")) if r.get("train/tokens_per_s")]
        row["tokens_per_s"] = [float(r["train/tokens_per_s"]) for r in rows]
    return row


def probe(workdir: Path) -> None:
    lines = ["One process, GPT 4 layers x 256, batch 1 x block_size, 2 steps, validation at the end (1 batch). "
             "The whole job's peak (cgroup), uncapped.", "",
             "| block_size | peak, val_batch_size 64 (MiB) | peak, val_batch_size 1 (MiB) |", "|---|---|---|"]
    for block in (4096, 8192, 16384, 32768):
        default = train(workdir, block, 1, ["data.val_batch_size=64"])
        one = train(workdir, block, 1, ["data.val_batch_size=1"])
        lines.append(f"| {block} | {default['peak'] / MiB:.0f} | {one['peak'] / MiB:.0f} |")
        print(lines[-1], flush=True)
    publish("context_parallel_probe", lines)


def longest(workdir: Path, contexts=(1, 2, 4)) -> None:
    lines = [f"GPT 4 layers x 256, batch 1, 2 steps, one validation row; each process capped at {CAP / GiB:.1f} GiB "
             "(context 1: the one process's job; 2 and 4: each worker in a group of its own). block_size doubled "
             "from 4096 until a run is killed.", "",
             "| context | longest block_size | its peak per process (MiB) | next (killed) |", "|---|---|---|---|"]
    for context in contexts:
        best, peak, block = None, 0, 4096
        while True:
            caps = {"cap": CAP} if context == 1 else {"worker_cap": CAP}
            row = train(workdir, block, context, ["data.val_batch_size=1"], **caps)
            print(f"context {context} block {block}: {'ok' if row['ok'] else 'killed' if row['oom'] else 'failed'} "
                  f"{(row['peak'] if context == 1 else row['workers']) / MiB:.0f} MiB", flush=True)
            if not row["ok"]:
                if not row["oom"]:
                    print(row["tail"], flush=True)
                break
            best, peak = block, row["peak"] if context == 1 else row["workers"]
            block *= 2
        lines.append(f"| {context} | {best} | {peak / MiB:.0f} | {block} |")
    publish("context_parallel_longest", lines)


def speed(workdir: Path, block: int = 8192) -> None:
    lines = [f"GPT 4 layers x 256, batch 1 x {block} tokens per step, 4 steps; tokens per second of the whole "
             "run (steps 2-4, mean), against one process.", "",
             "| context | processes | tokens/s | vs one process |", "|---|---|---|---|"]
    base = None
    for context in (1, 2, 4):
        row = train(workdir, block, context, ["data.val_batch_size=1"], steps=4)
        rate = sum(row["tokens_per_s"][1:]) / max(len(row["tokens_per_s"][1:]), 1)
        base = base or rate
        lines.append(f"| {context} | {context} | {rate:.0f} | {rate / base:.2f}x |")
        print(lines[-1], flush=True)
    publish("context_parallel_speed", lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", default=["probe", "longest", "speed"])
    args = parser.parse_args()
    why = cgroup.available()
    if why:
        sys.exit(f"benchmarks/context_parallel.py needs memory cgroups: {why}")
    with tempfile.TemporaryDirectory() as tmp:
        for part in args.parts:
            {"probe": probe, "longest": longest, "speed": speed}[part](Path(tmp))


if __name__ == "__main__":
    main()
