"""Start-up: wall time of `python train.py trainer.max_steps=1` (the default job cut to one step:
data, model, validation at start and end, a checkpoint) beside `python -c "import torch"`, side by
side (A B A B ..., median of ROUNDS); then where the framework's own imports go
(`python -X importtime`), grouped by top-level package.

    .venv-bench/bin/python benchmarks/startup.py        (about 2 minutes)
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

# The least a hand-written script pays for the same job: the default GPT, AdamW, one step on a
# random batch, its state saved. Creating a torch optimizer imports torch._dynamo (and sympy),
# so this floor is already well above `import torch`.
RAW_STEP = """
import torch
from framework.models.gpt import GPT
torch.manual_seed(0)
model = GPT(vocab_size=256, block_size=128, n_layer=2, n_head=4, n_embd=128, dropout=0.1)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
x = torch.randint(0, 256, (32, 129))
logits = model(x[:, :-1])
loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), x[:, 1:].reshape(-1))
loss.backward()
optimizer.step()
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "raw_step.pt")
"""


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
    light = ["trainer.max_steps=1", "trainer.val_at_start=false", "trainer.val_batches=1"]
    commands = {
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
        "a raw PyTorch script: GPT, AdamW, one step, torch.save": [sys.executable, "-c", RAW_STEP],
        "python train.py trainer.max_steps=1": [sys.executable, str(ROOT / "train.py"), "trainer.max_steps=1"],
        # the same with validation cut to one batch at the end: what is left is set-up
        f"python train.py {' '.join(light)}": [sys.executable, str(ROOT / "train.py"), *light],
    }
    times = {name: [] for name in commands}
    with tempfile.TemporaryDirectory() as cwd:
        for round_ in range(ROUNDS):
            for i, (name, cmd) in enumerate(commands.items()):
                unique = [f"name=startup_{round_}_{i}"] if "train.py" in name else []  # a fresh run each time
                times[name].append(wall([*cmd, *unique], cwd))
        total, ranked = import_profile([str(ROOT / "train.py"), "trainer.max_steps=1"], cwd)
    base = statistics.median(times["python -c 'import torch'"])
    raw = statistics.median(times["a raw PyTorch script: GPT, AdamW, one step, torch.save"])
    lines = [f"{ROUNDS} interleaved rounds, medians.", "",
             "| command | median seconds | ratio to import torch | ratio to the raw script |", "|---|---|---|---|"]
    for name, values in times.items():
        med = statistics.median(values)
        shown = name if name.startswith("a raw") else f"`{name}`"
        lines.append(f"| {shown} | {med:.2f} | {med / base:.2f} | {med / raw:.2f} |")
    lines += ["", f"Imports of `python train.py trainer.max_steps=1` (`-X importtime`, self time summed by top-level "
              f"package; {total:.2f} s in all):", "", "| package | seconds | share |", "|---|---|---|"]
    for package, seconds in ranked[:12]:
        lines.append(f"| {package} | {seconds:.3f} | {seconds / total:.0%} |")
    publish("startup", lines)


if __name__ == "__main__":
    main()
