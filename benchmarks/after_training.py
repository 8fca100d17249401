"""After training: generation speed and the test stage's throughput, side by side.

1. The built-in GPT writing 128 tokens after a 16-token prompt, greedy, with its KV cache and
   recomputing the whole sequence per token (`--no-cache`), at two sizes.
2. A Hugging Face GPT-2 (the same architecture a `framework convert --to hf` export holds, random
   weights of that shape) through the framework's `generate` against transformers' own
   `model.generate` on the same weights and settings: the framework's share of the time.
3. `framework test` of one GPT checkpoint on the stdlib test split under single_device, ddp and
   fsdp at 1 and 2 processes: tokens scored per second (the stage's own wall time, launch
   included, as test_metrics.json records it) and the command's whole wall time.

Interleaved rounds (A B A B ...), medians.

    .venv/bin/python benchmarks/after_training.py        (about 4 minutes)
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from results_table import publish  # benchmarks/ is on sys.path when a script runs

from framework.generation.decode import generate
from framework.models.gpt import GPT
from framework.sampling import Sampling

ROUNDS = 5
NEW_TOKENS = 128
PROMPT = list(b"import os\nimport s")[:16]
GPT_SIZES = {"GPT 4x128 (0.8M)": {"n_layer": 4, "n_embd": 128, "n_head": 4, "block_size": 256},
             "GPT 8x384 (14M)": {"n_layer": 8, "n_embd": 384, "n_head": 6, "block_size": 256}}


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_rates(runs: dict[str, callable], tokens: int) -> dict[str, float]:
    for fn in runs.values():  # warm-up: first calls allocate and pick kernels
        fn()
    times = {name: [] for name in runs}
    for _ in range(ROUNDS):
        for name, fn in runs.items():
            times[name].append(timed(fn))
    return {name: tokens / statistics.median(values) for name, values in times.items()}


def builtin_gpt() -> list[str]:
    rows = ["| model | KV cache (tokens/s) | recomputing (tokens/s) | cache / recompute |", "|---|---|---|---|"]
    sampling = Sampling(temperature=0, max_new_tokens=NEW_TOKENS)
    for name, size in GPT_SIZES.items():
        torch.manual_seed(0)
        model = GPT(**size).eval()
        rates = median_rates({"cache": lambda: generate(model, PROMPT, sampling),  # noqa: B023 (timed in this iteration)
                              "none": lambda: generate(model, PROMPT, sampling, use_cache=False)},  # noqa: B023
                             NEW_TOKENS)
        rows.append(f"| {name} | {rates['cache']:.0f} | {rates['none']:.0f} | {rates['cache'] / rates['none']:.2f}x |")
    return rows


def hugging_face() -> list[str]:
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50257, n_positions=256, n_embd=384, n_layer=6, n_head=6)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.tensor([PROMPT])
    sampling = Sampling(temperature=0, max_new_tokens=NEW_TOKENS)

    def raw():
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                           pad_token_id=0, eos_token_id=None)

    own = GPT(vocab_size=50257, block_size=256, n_layer=6, n_head=6, n_embd=384).eval()  # the same shape
    rates = median_rates({"framework": lambda: generate(model, PROMPT, sampling), "transformers": raw,
                          "own": lambda: generate(own, PROMPT, sampling)}, NEW_TOKENS)
    return ["| GPT-2 6x384 (30M), greedy, 128 tokens | framework generate (tokens/s) | transformers generate "
            "(tokens/s) | framework / transformers |", "|---|---|---|---|",
            f"| same weights, same settings | {rates['framework']:.0f} | {rates['transformers']:.0f} | "
            f"{rates['framework'] / rates['transformers']:.2f}x |",
            f"| the built-in GPT of the same shape, its KV cache | {rates['own']:.0f} | | "
            f"{rates['own'] / rates['transformers']:.2f}x |"]


def framework(*args: str, cwd: Path) -> float:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "framework", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"framework {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return time.perf_counter() - start


def test_stage() -> list[str]:
    settings = {"single_device@1": ["strategy=single_device", "devices=1"], "ddp@2": ["strategy=ddp", "devices=2"],
                "fsdp@2": ["strategy=fsdp", "devices=2"]}
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        framework("train", "name=gpt", "trainer.max_steps=1", "trainer.val_at_start=false", "trainer.val_batches=1",
                  "trainer.plot=false", "trainer.progress_bar=false", cwd=cwd)
        stage, command = {name: [] for name in settings}, {name: [] for name in settings}
        tokens = 0
        for _ in range(3):
            for name, overrides in settings.items():
                command[name].append(framework("test", "outputs/gpt", *overrides, cwd=cwd))
                record = json.loads((cwd / "outputs/gpt/test_metrics.json").read_text())
                stage[name].append(record["wall_time_s"])
        from framework.data.stdlib_text import StdlibText

        data = StdlibText(block_size=128)
        tokens = len(data.test_dataset()) * 128
    rows = [f"| default GPT, stdlib test split ({tokens:,} tokens) | stage wall time (s) | tokens/s | command wall "
            "time (s) |", "|---|---|---|---|"]
    for name in settings:
        seconds = statistics.median(stage[name])
        rows.append(f"| {name} | {seconds:.2f} | {tokens / seconds:,.0f} | {statistics.median(command[name]):.2f} |")
    return rows


def main() -> None:
    lines = ["Generation, the built-in GPT (greedy, 16-token prompt, 128 new tokens, batch 1, CPU):", "",
             *builtin_gpt(), "", "Through the framework against transformers on the same Hugging Face model:", "",
             *hugging_face(), "", "The test stage (`framework test`), median of 3:", "", *test_stage()]
    publish("after_training", lines)


if __name__ == "__main__":
    main()
