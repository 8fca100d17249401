"""`trainer.compile=true` on the CPU: eager and compiled runs of the same job side by side
(A B A B ..., ROUNDS rounds), one process and fsdp at 2 processes. Per run: the first step's time
(compilation included: the loop's first logged step spans it) and the steady step (the median of
the steps after the first), from the run's metrics.csv; the compiled runs also say how long their
first step took. Inductor's cache starts empty (a directory of this script's own), so round 1
of a compiled case is a cold compile and the later rounds find their kernels cached, as a user's
second run does.

Then what compilation did, counted rather than timed: aten operations dispatched in one training
step (forward, backward, AdamW) by torch.profiler, for the model eager, compiled whole by
`torch.compile(model)`, and compiled by the framework (whole, as under single_device and ddp; by
unit, as under the sharding strategies). The framework's whole-model compile must dispatch no more
than torch.compile(model); by unit leaves the embeddings, final norm and head eager.

    .venv/bin/python benchmarks/compile.py        (about 8 minutes)
"""
from __future__ import annotations

import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from memory_per_rank import step_seconds  # benchmarks/ is on sys.path when a script runs
from results_table import publish

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 3
STEPS = 12
MODEL = ["model.n_layer=4", "model.n_embd=256", "model.n_head=4", "model.block_size=128", "model.dropout=0.0"]
RUN = ["data.batch_size=16", "data.max_bytes=2000000", "trainer.val_at_start=false", "trainer.val_every=1000",
       f"trainer.max_steps={STEPS}", "trainer.log_every=1", "trainer.progress_bar=false", "trainer.plot=false",
       "logger=[csv]", "callbacks=[]"]
CASES = {"one process": ["strategy=single_device", "devices=1"], "fsdp, 2 processes": ["strategy=fsdp", "devices=2"]}
FIRST_STEP = re.compile(r"compile: the first step took ([0-9.]+) s")


def run(workdir: Path, world: list[str], compiled: bool, cache: Path) -> dict:
    out = workdir / f"run{len(list(workdir.iterdir()))}"
    command = [sys.executable, str(ROOT / "train.py"), *world, *MODEL, *RUN, f"trainer.compile={str(compiled).lower()}",
               f"hydra.run.dir={out}"]
    result = subprocess.run(command, cwd=workdir, capture_output=True, text=True,
                            env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)})
    if result.returncode != 0:
        sys.exit(f"compile benchmark: {' '.join(command)} failed:\n{result.stderr[-2000:]}")
    seconds = step_seconds(out)
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    said = FIRST_STEP.search(result.stdout)
    return {"first": seconds[0], "steady": statistics.median(seconds[1:]),
            "first_step_said": float(said.group(1)) if said else None,
            "losses": [float(r["train/loss"]) for r in rows if r.get("train/loss")]}


def main() -> None:
    lines = [f"GPT (n_layer 4, n_embd 256, 4 heads, block 128), batch 16, fp32, AdamW, {STEPS} steps, CPU, "
             f"{ROUNDS} interleaved rounds (eager, compiled, eager, ...). First step: compilation included; round 1 "
             "of a compiled case compiles with an empty inductor cache (cold), later rounds find it filled (warm); an "
             "eager run compiles nothing. "
             "Steady step: median of steps 2-12, then the median over rounds.", "",
             "| case | mode | first step, round 1 (s) | first step, rounds 2-3 (s) | first step as said, cold (s) "
             "| steady step (ms) "
             "| steady vs eager | loss at step 12 |", "|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        workdir, cache = Path(tmp) / "runs", Path(tmp) / "inductor-cache"
        workdir.mkdir()
        for case, world in CASES.items():
            got: dict[bool, list[dict]] = {False: [], True: []}
            for _ in range(ROUNDS):
                for compiled in (False, True):
                    got[compiled].append(run(workdir, world, compiled, cache))
            eager_steady = statistics.median(r["steady"] for r in got[False])
            for compiled, mode in ((False, "eager"), (True, "compiled")):
                runs = got[compiled]
                steady = statistics.median(r["steady"] for r in runs)
                warm = statistics.median(r["first"] for r in runs[1:])
                forward = f"{runs[0]['first_step_said']:.1f}" if runs[0]["first_step_said"] is not None else "-"
                lines.append(f"| {case} | {mode} | {runs[0]['first']:.2f} | {warm:.2f} | {forward} | "
                             f"{1000 * steady:.0f} | {steady / eager_steady:.2f}x | {runs[0]['losses'][-1]:.4f} |")
                print(lines[-1], flush=True)
        lines += operations_per_step(Path(tmp) / "inductor-cache")
    publish("compile", lines)


def operations_per_step(cache: Path) -> list[str]:
    """aten operations one training step dispatches, per way of compiling the same GPT."""
    counts = {name: count_operations(mode) for name, mode in OPERATION_CASES.items()}
    eager = counts["eager"]
    lines = ["", "aten operations in one training step (forward, backward, AdamW), torch.profiler, the same GPT "
             "(n_layer 4, n_embd 256, batch 16 x 128):", "", "| model | operations | vs eager |", "|---|---|---|"]
    lines += [f"| {name} | {count} | {count / eager:.2f}x |" for name, count in counts.items()]
    for line in lines:
        print(line, flush=True)
    return lines


OPERATION_CASES = {"eager": "eager", "torch.compile(model)": "raw",
                   "framework: whole model (single_device, ddp)": "whole",
                   "framework: by unit (fsdp, hsdp, model_parallel)": "units"}


def count_operations(mode: str, n_layer: int = 4, n_embd: int = 256, n_head: int = 4, block_size: int = 128,
                     batch: int = 16) -> int:
    """aten operations dispatched in the fourth training step (forward, backward, AdamW; three to
    compile and warm up) of a plain loop on a GPT: mode eager, raw (torch.compile(model)), whole or
    units (the framework's compile). tests/construction/test_compile.py counts a tiny GPT with it."""
    import torch
    from torch.nn import functional as F
    from torch.profiler import ProfilerActivity, profile

    from framework.construction.compile import compile_model
    from framework.construction.units import choose_units
    from framework.models.gpt import GPT

    torch.manual_seed(0)
    model = GPT(vocab_size=256, block_size=block_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd, dropout=0.0)
    forward = torch.compile(model) if mode == "raw" else model
    if mode in ("whole", "units"):
        compile_model(model, choose_units if mode == "units" else None, talk=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 256, (batch, block_size + 1), generator=torch.Generator().manual_seed(0))

    def step():
        F.cross_entropy(forward(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return sum(1 for event in prof.events() if event.name.startswith("aten::"))


if __name__ == "__main__":
    main()
