"""The GRPO demonstration (docs/grpo.md), run as a user runs it, and its figures: a small byte-level
GPT taught to add two numbers below 100 by next-token training (recipe grpo_arithmetic_sft), then
trained by GRPO with an exact-match reward (recipe grpo_arithmetic), on a CPU.

Reported: the held-out accuracy (`framework test`, greedy, on arithmetic_test.jsonl: 553 sums neither
stage trains on) of the SFT model and of the GRPO run's best checkpoint, the validation reward (held-out
prompts of the GRPO file, greedy) and the sampled training reward by step, each stage's wall time.
Writes benchmarks/results/grpo_arithmetic.md and docs/assets/grpo-arithmetic.png.

    .venv/bin/python benchmarks/grpo_arithmetic.py        (about 3 minutes on 2 cores)
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_table import publish  # benchmarks/ is on sys.path when a script runs

ROOT = Path(__file__).resolve().parent.parent
FIGURE = ROOT / "docs" / "assets" / "grpo-arithmetic.png"
HELD_OUT = ["data=prompt_files", "task=grpo", "data.files=${example_data:arithmetic_prompts.jsonl}",
            "data.test_files=${example_data:arithmetic_test.jsonl}", "data.max_prompt_tokens=16",
            "task.max_completion_tokens=4", "task.stop='\\n'", "data.batch_size=8"]


def run(args: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def metrics(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    found: dict[str, list[tuple[int, float]]] = {}
    with open(run_dir / "metrics.csv") as f:
        for row in csv.DictReader(f):
            for key, value in row.items():
                if key != "step" and value not in ("", None):
                    found.setdefault(key, []).append((int(row["step"]), float(value)))
    return found


def tested(target: Path, cwd: Path, overrides: list[str]) -> float:
    run([str(ROOT / "framework" / "__main__.py"), "test", str(target), *overrides], cwd)
    return json.loads((target.parent.parent / "test_metrics.json").read_text())["metrics"]["test/reward"]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        recipe = ["--config-dir", str(ROOT / "recipes"), "--config-name"]
        sft_s = run([str(ROOT / "train.py"), *recipe, "grpo_arithmetic_sft", "name=sft", "trainer.plot=false",
                     "trainer.progress_bar=false"], work)
        sft = work / "outputs" / "sft" / "checkpoints" / "step_000500"
        before = tested(sft, work, HELD_OUT)
        grpo_s = run([str(ROOT / "train.py"), *recipe, "grpo_arithmetic", "name=grpo", "trainer.plot=false",
                      "trainer.progress_bar=false", f"ckpt_path={sft / 'model.pt'}"], work)
        grpo = work / "outputs" / "grpo"
        after = json.loads((grpo / "test_metrics.json").read_text())
        found = metrics(grpo)
    val, train = found["val/reward"], found["train/reward"]
    lines = ["GRPO on the toy sums (recipes grpo_arithmetic_sft then grpo_arithmetic; CPU, 2 cores):", "",
             "| stage | wall time (s) | held-out accuracy (framework test, 553 sums) |", "|---|---|---|",
             f"| SFT, 500 steps | {sft_s:.0f} | {before:.3f} |",
             f"| GRPO, 400 steps (its best checkpoint, step {after['step']}) | {grpo_s:.0f} | "
             f"{after['metrics']['test/reward']:.3f} |", "",
             "Validation reward (greedy, the GRPO file's held-out 10%) and sampled training reward (a mean over the "
             "5 steps logged) by step:", "",
             "| step | val/reward | train/reward |", "|---|---|---|"]
    by_step = dict(train)
    for step, value in val:
        shown = f"{by_step[step]:.3f}" if step in by_step else ""
        lines.append(f"| {step} | {value:.3f} | {shown} |")
    first = [v for step, v in train if step <= 50]
    last = [v for step, v in train if step > train[-1][0] - 50]
    lines += ["", f"Sampled training reward, mean of the first 50 steps: {sum(first) / len(first):.3f}; of the last 50: "
              f"{sum(last) / len(last):.3f}."]
    publish("grpo_arithmetic", lines)
    plot(train, val, before, after)


def plot(train, val, before: float, after: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot(*zip(*train), label="train/reward (sampled, temperature 1)", color="tab:blue", alpha=0.6)
    ax.plot(*zip(*val), "o-", label="val/reward (greedy, held-out prompts)", color="tab:orange")
    ax.axhline(before, ls="--", color="gray", label=f"held-out test before GRPO: {before:.3f}")
    ax.axhline(after["metrics"]["test/reward"], ls=":", color="tab:green",
               label=f"held-out test after (step {after['step']}): {after['metrics']['test/reward']:.3f}")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("exact-match reward")
    ax.set_ylim(0, 1)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("GRPO on two-number sums (byte-level GPT 4x128, CPU)")
    fig.tight_layout()
    fig.savefig(FIGURE, dpi=110)


if __name__ == "__main__":
    main()
