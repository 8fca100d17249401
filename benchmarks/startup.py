"""Start-up: the framework's one-step job beside a raw PyTorch script doing the same job, for the
default GPT and for the digits MLP, side by side (A B A B ..., median of ROUNDS); then where the
framework's own imports go (`python -X importtime`), grouped by top-level package.

The same job, in both: read the data, build the model and AdamW, validate the same batches at the
start, one training step (cosine schedule, gradient clipping), validate again at the end, write a
checkpoint (model and optimizer state) and a metrics file. The raw scripts use the same data and
model classes (a user's own code in a raw script), not the framework's loop, config, checks or
run directory. The framework runs with `trainer.plot=false` (the raw script draws no figure; the
default job's figure is measured as its own row).

    .venv/bin/python benchmarks/startup.py        (about 3 minutes)
"""
from __future__ import annotations

import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_table import publish  # benchmarks/ is on sys.path when a script runs

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 5

RAW_JOB = """
import csv, math
import torch
from torch.utils.data import DataLoader
{imports}
torch.manual_seed(1234)
data = {data}
model = {model}
optimizer = torch.optim.AdamW(model.parameters(), lr={lr}, betas=(0.9, 0.99), weight_decay=0.01)
schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / {steps})))
train = DataLoader(data.train_dataset(), batch_size=data.batch_size, shuffle=True, drop_last=True,
                   generator=torch.Generator().manual_seed(1234))
val = DataLoader(data.val_dataset(), batch_size=data.val_batch_size)


def loss_of(x, y, reduction="mean"):
    logits = model(x)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1),
                                             reduction=reduction)


def validate():
    model.eval()
    total = count = 0.0
    with torch.no_grad():
        for i, (x, y) in enumerate(val):
            if i == {val_batches}:
                break
            total += loss_of(x, y, "sum").item()
            count += y.numel()
    model.train()
    return total / count


rows = [{{"step": 0, "val/loss": validate()}}]
x, y = next(iter(train))
loss = loss_of(x, y)
loss.backward()
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
optimizer.step()
optimizer.zero_grad(set_to_none=True)
schedule.step()
rows.append({{"step": 1, "train/loss": loss.item(), "val/loss": validate()}})
torch.save({{"model": model.state_dict(), "optimizer": optimizer.state_dict()}}, "raw_checkpoint.pt")
with open("raw_metrics.csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=["step", "train/loss", "val/loss"])
    writer.writeheader()
    writer.writerows(rows)
"""

JOBS = {
    "GPT (the default job)": {
        "raw": RAW_JOB.format(
            imports="from framework.data.stdlib_text import StdlibText\nfrom framework.models.gpt import GPT",
            data="StdlibText(block_size=128, batch_size=32, val_batch_size=64)",
            model="GPT(vocab_size=256, block_size=128, n_layer=2, n_head=4, n_embd=128, dropout=0.1)",
            lr=3e-3, steps=1, val_batches=10),
        "framework": [str(ROOT / "train.py"), "trainer.max_steps=1", "trainer.plot=false"],
        "default": [str(ROOT / "train.py"), "trainer.max_steps=1"],
    },
    "digits MLP (recipe digits_classifier)": {
        "raw": RAW_JOB.format(
            imports="from framework.data.digits import Digits\nfrom framework.models.mlp import MLP",
            data="Digits(batch_size=64, val_batch_size=256)",
            model="MLP(in_features=64, hidden=128, depth=2, num_classes=10, dropout=0.1)",
            lr=3e-3, steps=1, val_batches=-1),
        "framework": [str(ROOT / "train.py"), "--config-dir", str(ROOT / "recipes"), "--config-name",
                      "digits_classifier", "trainer.max_steps=1", "trainer.plot=false", "trainer.test_at_end=false"],
        "default": None,
    },
}


def wall(cmd: list[str], cwd: str) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.perf_counter() - start


def import_profile(cmd: list[str], cwd: str) -> tuple[float, list[tuple[str, float]]]:
    """(total import seconds, [(top-level package, self seconds)], largest first)."""
    result = subprocess.run([sys.executable, "-X", "importtime", *cmd], cwd=cwd, capture_output=True, text=True,
                            check=True)
    by_package: dict[str, float] = collections.defaultdict(float)
    for line in result.stderr.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if match:
            by_package[match.group(4).split(".")[0]] += int(match.group(1)) / 1e6
    ranked = sorted(by_package.items(), key=lambda kv: -kv[1])
    return sum(by_package.values()), ranked


def main() -> None:
    commands: dict[tuple[str, str], list[str]] = {("", "python -c 'import torch'"): [sys.executable, "-c",
                                                                                     "import torch"]}
    for job, spec in JOBS.items():
        commands[job, "raw script"] = [sys.executable, "-c", spec["raw"]]
        commands[job, "framework, trainer.plot=false"] = [sys.executable, *spec["framework"]]
        if spec["default"]:
            commands[job, "framework, as shipped (draws metrics.png)"] = [sys.executable, *spec["default"]]
    times = {key: [] for key in commands}
    with tempfile.TemporaryDirectory() as cwd:
        for round_ in range(ROUNDS):
            for i, (key, cmd) in enumerate(commands.items()):
                unique = [f"name=startup_{round_}_{i}"] if "train.py" in " ".join(cmd) else []  # a fresh run each time
                times[key].append(wall([*cmd, *unique], cwd))
        total, ranked = import_profile(JOBS["GPT (the default job)"]["framework"], cwd)
    base = statistics.median(times["", "python -c 'import torch'"])
    lines = [f"{ROUNDS} interleaved rounds, medians.", "",
             "| job | command | median seconds | ratio to the raw script | ratio to import torch |",
             "|---|---|---|---|---|"]
    for (job, name), values in times.items():
        med = statistics.median(values)
        raw = statistics.median(times[job, "raw script"]) if job else float("nan")
        lines.append(f"| {job or '-'} | {name} | {med:.2f} | {med / raw:.2f} | {med / base:.2f} |")
    lines += ["", f"Imports of the framework's GPT job (`-X importtime`, self time summed by top-level package; "
              f"{total:.2f} s in all):", "", "| package | seconds | share |", "|---|---|---|"]
    for package, seconds in ranked[:12]:
        lines.append(f"| {package} | {seconds:.3f} | {seconds / total:.0%} |")
    publish("startup", lines)


if __name__ == "__main__":
    main()
