"""Peak memory per rank for each strategy, beside the formula's prediction.

A ~100M-parameter GPT with AdamW, bf16 mixed precision, 2 processes on the CPU (gloo); a few
steps each. "training peak" is a rank's peak resident memory while training (the high-water
mark is reset after set-up) minus its resident memory before the model was built (torch, the
data): model states plus activations and temporary buffers. "set-up peak" is the same for
building and wrapping the model (every rank builds the full fp32 model before sharding it).
On the CPU, "offload" moves state to the same memory, so the measured column cannot show the
device-memory saving the formula predicts for a GPU; the prediction is for device memory.

    .venv/bin/python benchmarks/memory_per_rank.py        (about 5 minutes on 2 cores)
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
N = 2
MODEL = ["model.n_layer=14", "model.n_embd=768", "model.n_head=12", "model.block_size=64", "model.dropout=0.0"]
RUN = [*MODEL, f"devices={N}", "precision=bf16", "data.batch_size=2", "data.val_batch_size=2",
       "data.max_bytes=200000", "trainer.max_steps=3", "trainer.val_at_start=false", "trainer.val_every=1000",
       "trainer.val_batches=1", "trainer.log_every=1", "trainer.progress_bar=false", "logger=null",
       "callbacks=[memory_monitor]"]
STRATEGIES = ["ddp", "fsdp", "deepspeed_stage_2", "deepspeed_stage_3", "deepspeed_stage_3_offload"]


def count_parameters() -> tuple[int, int]:
    """(all parameters, the largest single module's own parameters) of the benchmark model."""
    import torch
    from hydra import compose, initialize_config_dir

    sys.path.insert(0, str(ROOT))
    from framework.config.build import build

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="train", overrides=MODEL)
    with torch.device("meta"):
        model = build(cfg.model, "model")
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return total, largest


def predicted_bytes(strategy: str, psi: int, largest: int) -> float:
    """FACTS.md's bytes per rank on the device for Ψ parameters, N ranks, largest layer L."""
    return {
        "ddp": 16 * psi,
        "fsdp": 16 * psi / N,  # plus the unsharded buffers of the unit being computed
        "deepspeed_stage_2": 2 * psi + 18 * psi / N,
        "deepspeed_stage_3": 4 * largest + 18 * psi / N,
        "deepspeed_stage_3_offload": 4 * largest,
    }[strategy]


def measure(strategy: str, workdir: Path) -> dict:
    out = workdir / strategy
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), f"strategy={strategy}", *RUN,
                             f"hydra.run.dir={out}"], capture_output=True, text=True, cwd=workdir)
    if result.returncode != 0:
        raise RuntimeError(f"{strategy} failed:\n{result.stderr[-3000:]}")
    ranks = json.loads((out / "memory.json").read_text())["ranks"]
    return max(ranks, key=lambda r: r["train_peak_rss_bytes"] - r["baseline_rss_bytes"])


def main() -> None:
    psi, largest = count_parameters()
    gib = 2**30
    lines = [f"Model: GPT, {psi / 1e6:.1f}M parameters (largest layer {largest / 1e6:.2f}M), AdamW, "
             f"precision=bf16, {N} ranks on the CPU (gloo).", "",
             "| strategy | training peak - baseline, worst rank (GiB) | set-up peak - baseline (GiB) "
             "| formula, device bytes per rank (GiB) | training / formula |",
             "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in STRATEGIES:
            rank = measure(strategy, Path(tmp))
            measured = (rank["train_peak_rss_bytes"] - rank["baseline_rss_bytes"]) / gib
            setup = (rank["setup_peak_rss_bytes"] - rank["baseline_rss_bytes"]) / gib
            predicted = predicted_bytes(strategy, psi, largest) / gib
            lines.append(f"| {strategy} | {measured:.2f} | {setup:.2f} | {predicted:.2f} | {measured / predicted:.2f} |")
            print(lines[-1], flush=True)
    table = "\n".join(lines)
    (ROOT / "benchmarks" / "results").mkdir(exist_ok=True)
    (ROOT / "benchmarks" / "results" / "memory_per_rank.md").write_text(table + "\n")
    print("\n" + table)


if __name__ == "__main__":
    main()
