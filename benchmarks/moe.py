"""Mixtures of experts, measured side by side in one run (`python train.py` as a user runs it).

Parts (each writes benchmarks/results/moe_<part>.md):

- `memory`: a many-expert GPT (4 Blocks, n_embd 256, 32 experts of hidden 1024, top-2: ~70M
  parameters, ~10M active) at 2 processes under ddp, fsdp and fsdp with expert_parallel_size=2:
  each rank's training peak above its baseline (the memory_monitor callback, in a cgroup:
  benchmarks/cgroup.py), the whole job's peak, and `framework plan`'s estimate.
- `speed`: one process, the dense GPT against the same GPT with 8 experts, top-1, each expert the
  dense MLP (equal active parameters but the router's): tokens per second, interleaved rounds.
- `balance`: 120 steps of an 8-expert top-2 GPT with the balancing loss (coefficient 0.01), with
  DeepSeek-V3's bias balancing, and with neither: each layer's busiest expert's tokens over the
  mean (train/moe_load_max/<layer>), averaged over the last logged steps.

    .venv/bin/python benchmarks/moe.py [memory|speed|balance ...]     (as root for memory; ~10 minutes)
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cgroup  # noqa: E402
from memory_per_rank import planned, train  # noqa: E402
from results_table import publish  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20
MANY_EXPERTS = ["model.n_layer=4", "model.n_embd=256", "model.n_head=4", "model.moe.num_experts=32",
                "model.moe.top_k=2", "model.moe.expert_hidden=1024"]
LAYOUTS = {"ddp@2": ("ddp", []), "fsdp@2": ("fsdp", []),
           "fsdp@2, expert parallel 2": ("fsdp", ["strategy.expert_parallel_size=2"])}
FAST = ["model.dropout=0.0", "data.batch_size=8", "data.max_bytes=300000", "trainer.val_at_start=false",
        "trainer.val_every=100000", "trainer.progress_bar=false", "trainer.plot=false", "callbacks=[]"]


def memory(workdir: Path) -> None:
    lines = ["GPT with 4 MoE Blocks (n_embd 256, 32 experts of hidden 1024, top-2), fp32, AdamW, batch 4 x 128 "
             "tokens, 3 steps, 2 processes (gloo). Per rank: worst rank, training peak above its baseline.", "",
             "| layout | training peak / rank (MiB) | vs ddp | whole job (MiB) | plan's estimate / rank (MiB) |",
             "|---|---|---|---|---|"]
    rows = {}
    for name, (strategy, extra) in LAYOUTS.items():
        row = train(workdir, strategy, 2, MANY_EXPERTS, extra)
        if not row["ok"]:
            raise SystemExit(f"{name} failed:\n{row['tail']}")
        rows[name] = row
        estimate = planned(strategy, 2, MANY_EXPERTS, extra)
        lines.append(f"| {name} | {row['train'] / MiB:.0f} | {row['train'] / rows['ddp@2']['train']:.2f}x | "
                     f"{row['job_peak'] / MiB:.0f} | {estimate / MiB:.0f} |")
        print(lines[-1], flush=True)
    publish("moe_memory", lines)


def tokens_per_s(out: Path) -> float:
    with open(out / "metrics.csv") as f:
        values = [float(r["train/tokens_per_s"]) for r in csv.DictReader(f) if r.get("train/tokens_per_s")]
    return statistics.median(values[len(values) // 3:])  # past the first steps' warm-up


def run(workdir: Path, overrides: list[str], name: str) -> Path:
    out = workdir / name
    result = cgroup.run([sys.executable, str(ROOT / "train.py"), *FAST, *overrides, f"hydra.run.dir={out}"],
                        cwd=workdir)
    if result.returncode:
        raise SystemExit(f"{name} failed:\n{result.stderr[-2000:]}")
    return out


def speed(workdir: Path, rounds: int = 3) -> None:
    shape = ["model.n_layer=4", "model.n_embd=256", "model.n_head=4", "trainer.max_steps=60", "trainer.log_every=5"]
    cases = {"dense": [], "8 experts, top-1 (equal active)": ["model.moe.num_experts=8", "model.moe.top_k=1"],
             "8 experts, top-2": ["model.moe.num_experts=8", "model.moe.top_k=2"]}
    speeds: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(rounds):  # interleaved: A B C A B C ...
        for i, (name, extra) in enumerate(cases.items()):
            speeds[name].append(tokens_per_s(run(workdir, [*shape, *extra], f"speed{r}_{i}")))
    dense = statistics.median(speeds["dense"])
    lines = [f"One process, 2 threads, GPT 4 x 256, batch 8 x 128 tokens, 60 steps; median over {rounds} interleaved "
             "rounds of each run's median tokens/s past its first third.", "",
             "| model | tokens/s | vs dense |", "|---|---|---|"]
    for name, values in speeds.items():
        lines.append(f"| {name} | {statistics.median(values):.0f} | {statistics.median(values) / dense:.2f}x |")
    print("\n".join(lines), flush=True)
    publish("moe_speed", lines)


def balance(workdir: Path) -> None:
    shape = ["model.n_layer=2", "model.moe.num_experts=8", "model.moe.top_k=2", "trainer.max_steps=120",
             "trainer.log_every=10"]
    cases = {"balancing loss 0.01": ["model.moe.balance=loss", "model.moe.balance_coef=0.01"],
             "bias balancing, rate 0.001": ["model.moe.balance=bias", "model.moe.bias_rate=0.001"],
             "neither": ["model.moe.balance=none"]}
    lines = ["GPT 2 x 128, 8 experts top-2, batch 8 x 128 tokens, 120 steps, one process. Load: each layer's busiest "
             "expert's tokens over the mean (1.0 is even), the mean over the layers and the last 4 logged steps.", "",
             "| balancing | load max, steps 1-10 | load max, steps 90-120 | val/loss at 120 |", "|---|---|---|---|"]
    for i, (name, extra) in enumerate(cases.items()):
        out = run(workdir, [*shape, *extra, "trainer.val_every=120", "trainer.val_batches=4"], f"balance{i}")
        with open(out / "metrics.csv") as f:
            rows = list(csv.DictReader(f))
        loads = [statistics.mean(float(v) for k, v in r.items() if k.startswith("train/moe_load_max") and v)
                 for r in rows if r.get("train/loss")]
        val = [float(r["val/loss"]) for r in rows if r.get("val/loss")][-1]
        lines.append(f"| {name} | {loads[0]:.2f} | {statistics.mean(loads[-4:]):.2f} | {val:.3f} |")
        print(lines[-1], flush=True)
    publish("moe_balance", lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", nargs="*", default=["memory", "speed", "balance"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for part in args.parts:
            part_dir = Path(tmp) / part
            part_dir.mkdir()
            {"memory": memory, "speed": speed, "balance": balance}[part](part_dir)


if __name__ == "__main__":
    main()
