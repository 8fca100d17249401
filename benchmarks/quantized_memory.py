"""Memory of the quantized precisions (precision=bnb_*), measured as a user meets it: `python
train.py ...` in a cgroup of its own (benchmarks/cgroup.py), next to precision=32 and bf16.

The ~85M GPT (n_layer 12, n_embd 768), AdamW, batch 4 x 128 tokens, 3 steps, one process on the
CPU: the whole job's peak, and from the memory_monitor callback the training peak and the set-up
peak above the process's baseline (torch and data loaded), the last val loss after 3 steps, and
`framework plan`'s estimate. Writes benchmarks/results/quantized_memory.md.

    .venv/bin/python benchmarks/quantized_memory.py        (as root; a few minutes)
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cgroup  # noqa: E402
from memory_per_rank import SIZES, GiB, MiB, planned, train  # noqa: E402
from results_table import publish  # noqa: E402

PRECISIONS = ["32", "bf16", "bnb_int8", "bnb_nf4", "bnb_nf4_dq", "bnb_fp4"]


def main() -> None:
    why = cgroup.available()
    if why:
        sys.exit(f"quantized_memory: {why}")
    lines = ["GPT ~85M (n_layer 12, n_embd 768; its 84.9M linear weights quantized, the tied head and embedding "
             "kept), AdamW, batch 4 x 128 tokens, 3 steps, single_device on the CPU. Peaks above the process's "
             "baseline (torch and data loaded), from the memory_monitor callback; whole job from the cgroup.", "",
             "| precision | whole job (MiB) | training peak (MiB) | vs 32 | set-up peak (MiB) | plan estimate (MiB) "
             "| measured / estimate | seconds |",
             "|---|---|---|---|---|---|---|---|"]
    reference = None
    with tempfile.TemporaryDirectory() as tmp:
        for precision in PRECISIONS:
            row = train(Path(tmp), "single_device", 1, SIZES["85M"], [f"precision={precision}"], cap=20 * GiB)
            estimate = planned("single_device", 1, SIZES["85M"], [f"precision={precision}"])
            if not row["ok"]:
                lines.append(f"| {precision} | {row['job_peak'] / MiB:.0f} | failed | | | {estimate / MiB:.0f} | | |")
                print(row["tail"], file=sys.stderr)
            else:
                reference = reference or row["train"]
                lines.append(f"| {precision} | {row['job_peak'] / MiB:.0f} | {row['train'] / MiB:.0f} | "
                             f"{row['train'] / reference:.2f}x | {row['setup'] / MiB:.0f} | {estimate / MiB:.0f} | "
                             f"{row['train'] / estimate:.2f} | {row['seconds']:.0f} |")
            print(lines[-1], flush=True)
    publish("quantized_memory", lines)


if __name__ == "__main__":
    main()
