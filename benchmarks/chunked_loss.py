"""The peak memory of one training step with the whole logits and with task.loss_chunk_tokens, at a
large vocabulary: each case in a fresh process (its peak resident memory, `ru_maxrss`, above the
peak before the step), the loss and gradients compared between them.

    python benchmarks/chunked_loss.py [--vocab 65536] [--tokens 4096] [--chunk 1024]

Writes benchmarks/results/chunked_loss.md. About a minute on the 2-core CPU machine.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_table import publish  # noqa: E402

CASE = """
import json, resource, sys, time, torch
from framework.models.gpt import GPT
from framework.tasks.language_modeling import LanguageModeling
vocab, tokens, chunk = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
model = GPT(vocab_size=vocab, n_layer=2, n_embd=256, n_head=4, block_size=tokens)
batch = (torch.randint(0, vocab, (1, tokens)), torch.randint(0, vocab, (1, tokens)))
task = LanguageModeling(loss_chunk_tokens=None if chunk == "none" else int(chunk))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
total, count = task.training_sums(model, batch)
(total / count).backward()
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"loss": (total / count).item(), "step_s": seconds, "above_mib": (peak - before) / 1024,
                  "grad": model.tok_emb.weight.grad.double().norm().item()}))
"""


def run_case(vocab: int, tokens: int, chunk: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CASE, str(vocab), str(tokens), chunk], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=65536)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=1024)
    args = parser.parse_args()
    import torch

    logits_mib = args.tokens * args.vocab * 4 / 2**20
    plain = run_case(args.vocab, args.tokens, "none")
    chunked = run_case(args.vocab, args.tokens, str(args.chunk))
    lines = [f"GPT 2 x 256, one sequence of {args.tokens} tokens, vocabulary {args.vocab} (float32 logits: "
             f"{logits_mib:.0f} MiB), forward and backward of one step on the CPU, each case in a fresh process; "
             f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}.", "",
             "| case | peak above the model (MiB) | step (s) | loss | gradient norm (tok_emb) |", "|---|---|---|---|---|"]
    for name, r in (("whole logits", plain), (f"task.loss_chunk_tokens={args.chunk}", chunked)):
        lines.append(f"| {name} | {r['above_mib']:.0f} | {r['step_s']:.2f} | {r['loss']:.6f} | {r['grad']:.6f} |")
    lines += ["", f"Peak memory of the step: {chunked['above_mib'] / plain['above_mib']:.2f}x; loss difference "
              f"{abs(plain['loss'] - chunked['loss']):.1e}."]
    publish("chunked_loss", lines)


if __name__ == "__main__":
    main()
