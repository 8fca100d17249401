"""Adapters side by side: a full fine-tune in fp32 against LoRA in fp32, LoRA in bf16 mixed
precision and QLoRA (nf4), on a ~100M and a ~400M Hugging Face GPT-2 (random init of those
shapes: nothing is downloaded), trained on the chat example that ships with the framework
(recipe hf_lora_chat, byte tokens, rows of 256 tokens, batch 4, each GPT-2 block's activations
recomputed in backward so that the model states dominate; freed memory returned to the OS in every
row, as the quantized precisions do by default), one process on the CPU.

Per row: the trainable share of the parameters, the training peak of the process above its
baseline (the memory_monitor callback) and the whole job's peak (its cgroup, benchmarks/cgroup.py),
the median step time after the first step, the checkpoint's size on disk (model + optimizer state),
and the validation loss after STEPS steps. The issue's goals: QLoRA's peak <= 0.25x the full
fine-tune's, LoRA at rank 8 trains <= 1% of the parameters, an adapter checkpoint <= 2% of a full one.

    .venv/bin/python benchmarks/adapters.py [~100M] [~400M]   (as root; ~10 minutes for ~100M, far more for ~400M)
"""
from __future__ import annotations

import csv
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from framework.accelerator.cpu import CPUAccelerator

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cgroup  # noqa: E402
from memory_per_rank import GiB, MiB, train  # noqa: E402
from results_table import publish  # noqa: E402

STEPS = 4
RECIPE = ["model=hf_causal_lm", "data=chat_files"]  # what recipe hf_lora_chat chooses (its adapter: SETTINGS)
SIZES = {"~100M": ["model.config.n_layer=14", "model.config.n_embd=768", "model.config.n_head=12"],
         "~400M": ["model.config.n_layer=24", "model.config.n_embd=1152", "model.config.n_head=16"]}
RUN = ["data.block_size=256", "data.batch_size=4", "data.val_batch_size=4", "trainer.val_at_start=false",
       f"trainer.val_every={STEPS}", "trainer.val_batches=2", "trainer.activation_checkpointing=true",
       "trainer.log_every=1", "trainer.progress_bar=false",
       # every row with glibc's mmap threshold fixed (freed buffers go back to the OS), as the
       # quantized precisions have it by default: the peaks then compare the same allocator
       "accelerator=cpu", "accelerator.return_freed_memory=true",
       "trainer.plot=false", "logger=[csv]", "callbacks=[checkpoint,memory_monitor]",
       "optimizer.lr=0.0005"]
# bf16 math is emulated on a CPU without AVX512-BF16 or AMX (many times slower than float32; the
# compatibility table warns): there the bf16 row is not run and QLoRA's layers compute in float32
FAST_BF16 = CPUAccelerator().fast_bf16()
SETTINGS = {"full fine-tune, fp32": [],
            "LoRA r=8, fp32": ["adapter=lora"],
            "LoRA r=8, bf16": ["adapter=lora", "precision=bf16"] if FAST_BF16 else None,
            f"QLoRA r=8, nf4 (computing in {'bf16' if FAST_BF16 else 'fp32'})":
                ["adapter=lora", "precision=bnb_nf4", f"precision.compute_dtype={'bf16' if FAST_BF16 else 'fp32'}"]}


def measured(out: Path) -> dict:
    with open(out / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    rates = [float(r["train/tokens_per_s"]) for r in rows if r.get("train/tokens_per_s")]
    checkpoint = max((out / "checkpoints").glob("step_*"))
    summary = json.loads((out / "summary.json").read_text())
    saved = torch.load(checkpoint / "model.pt", weights_only=True)  # the trainable weights (all, for a full run)
    return {"step_s": 4 * 256 / statistics.median(rates[1:] or rates),
            "checkpoint": sum(p.stat().st_size for p in checkpoint.rglob("*.pt")),
            "val_loss": summary["metrics"]["val/loss"], "trainable": sum(t.numel() for t in saved.values())}


def main() -> None:
    why = cgroup.available()
    if why:
        sys.exit(f"adapters: {why}")
    lines = [f"Hugging Face GPT-2 shapes (random init, byte tokens), the chat example, batch 4 x 256 tokens, AdamW, "
             f"{STEPS} steps, activation checkpointing per block, one process on the CPU. Training peak: above the "
             "process's baseline (torch and data loaded), memory_monitor; whole job: its cgroup. Step time: median "
             "after the first step.", "",
             "| model | setting | trainable | training peak (MiB) | vs full | whole job (MiB) | step (s) "
             "| checkpoint (MiB) | vs full | val loss |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    chosen = sys.argv[1:] or list(SIZES)  # e.g. `adapters.py ~100M`: one size
    with tempfile.TemporaryDirectory() as tmp:
        for size, shape in ((s, SIZES[s]) for s in chosen):
            full = None
            for setting, extra in SETTINGS.items():
                if extra is None:
                    lines.append(f"| {size} | {setting} | not run: this CPU has no bf16 hardware | | | | | | | |")
                    continue
                row = train(Path(tmp), "single_device", 1, [*RECIPE, *shape], [*extra, "name=bench"], cap=22 * GiB,
                            steps=STEPS, run=RUN)
                if not row["ok"]:
                    lines.append(f"| {size} | {setting} | failed | | | {row['job_peak'] / MiB:.0f} | | | | |")
                    print(row["tail"], file=sys.stderr)
                    print(lines[-1], flush=True)
                    continue
                got = measured(row["out"])
                full = full or {**got, "train": row["train"]}
                share = f"{100 * got['trainable'] / full['trainable']:.2f}%"
                lines.append(f"| {size} | {setting} | {share} | {row['train'] / MiB:.0f} | "
                             f"{row['train'] / full['train']:.2f}x | {row['job_peak'] / MiB:.0f} | {got['step_s']:.2f} | "
                             f"{got['checkpoint'] / MiB:.1f} | {got['checkpoint'] / full['checkpoint']:.3f}x | "
                             f"{got['val_loss']:.3f} |")
                print(lines[-1], flush=True)
    publish("adapters", lines)


if __name__ == "__main__":
    main()
