"""The GPU check (`make gpu-check`): every strategy x precision x checkpoint_io that makes sense on
CUDA, a few steps each with nccl, at 1 GPU and at every GPU of the machine, each run a real
`python train.py ...`; losses compared with the same job on the CPU (float32, single_device).

Rows:
- precisions on one GPU: 32, 16 (GradScaler), bf16, 16_true, bf16_true, bnb_int8, bnb_nf4, te_fp8;
- strategies at N GPUs (and at 1 where N is 1) in 32, bf16 and 16: ddp, ddp_spawn, fsdp,
  fsdp_cpu_offload, hsdp, model_parallel, ddp_sharded, fairscale_fsdp, the DeepSpeed stages with the torch optimizer, and
  ZeRO-2 / ZeRO-3 with DeepSpeed's own optimizer;
- checkpoint_io torch, async and dcp under ddp, fsdp, deepspeed_stage_3 and model_parallel: 3 steps,
  resume, 3 more, compared bit for bit with 6 steps straight;
- hsdp and model_parallel (with sequence parallelism too), and trainer.compile=true under
  single_device, ddp, fsdp, hsdp and model_parallel.
A combination the compatibility table refuses is recorded as refused, with its reason.

Writes benchmarks/results/gpu_check.md (a table: result, last loss, difference to the CPU's).

    python benchmarks/gpu_check.py                       (a machine with CUDA GPUs; ~10 minutes)
    python benchmarks/gpu_check.py --accelerator cpu --rows single_device/32/torch   (the script itself)
"""
from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_table import publish  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASE = ["model.n_layer=2", "model.n_embd=64", "model.n_head=4", "model.block_size=64", "model.dropout=0.0",
        "data.max_bytes=300000", "data.batch_size=8", "data.val_batch_size=16", "trainer.val_batches=1",
        "trainer.val_every=1000", "trainer.val_at_start=false", "trainer.log_every=1", "trainer.progress_bar=false",
        "trainer.plot=false", "callbacks.checkpoint.every_n_steps=3", "logger=csv"]
STEPS = 6
# How far the last loss may be from the CPU's float32 reference, by precision
TOLERANCE = {"32": 2e-3, "16": 5e-2, "bf16": 5e-2, "16_true": 0.1, "bf16_true": 0.1, "bnb_int8": 0.15,
             "bnb_nf4": 0.15, "te_fp8": 0.15}
# the same hyper-parameters as conf/optimizer/adamw.yaml
DEEPSPEED_OWN_OPTIMIZER = ("+strategy.config.optimizer={type: AdamW, params: {lr: 0.003, betas: [0.9, 0.99], "
                           "weight_decay: 0.01}}")
MULTI = ["ddp", "ddp_spawn", "fsdp", "fsdp_cpu_offload", "hsdp", "model_parallel", "ddp_sharded", "fairscale_fsdp",
         "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_2_offload", "deepspeed_stage_3",
         "deepspeed_stage_3_offload"]
COMPILED = ["trainer.compile=true"]


@dataclass
class Row:
    strategy: str
    precision: str
    checkpoint_io: str
    devices: int
    extra: list = field(default_factory=list)
    note: str = ""
    resume: bool = False

    @property
    def key(self) -> str:
        return f"{self.strategy}/{self.precision}/{self.checkpoint_io}"


def rows(gpus: int) -> list[Row]:
    out = [Row("single_device", p, "torch", 1) for p in TOLERANCE]
    for devices in sorted({1, gpus} if gpus == 1 else {gpus}):
        for strategy in MULTI:
            for precision in ("32", "bf16", "16"):
                out.append(Row(strategy, precision, "torch", devices))
        for stage in ("deepspeed_stage_2", "deepspeed_stage_3"):
            out.append(Row(stage, "bf16", "torch", devices, [DEEPSPEED_OWN_OPTIMIZER], "DeepSpeed's own AdamW"))
        for strategy in ("ddp", "fsdp", "deepspeed_stage_3", "model_parallel"):
            for io in ("torch", "async", "dcp"):
                out.append(Row(strategy, "32", io, devices, note="3 steps + resume + 3", resume=True))
        out.append(Row("model_parallel", "bf16", "torch", devices, ["strategy.sequence_parallel=true"],
                       "sequence parallel"))
        for strategy in ("ddp", "fsdp", "hsdp", "model_parallel"):
            out.append(Row(strategy, "bf16", "torch", devices, COMPILED, "trainer.compile=true"))
    out.append(Row("single_device", "32", "torch", 1, COMPILED, "trainer.compile=true"))
    return out


def _run(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    started = time.time()
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=cwd, capture_output=True, text=True,
                            timeout=900)
    return result, time.time() - started


def _losses(run_dir: Path) -> list[float]:
    with open(run_dir / "metrics.csv") as f:
        return [float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")]


def _last_checkpoint(run_dir: Path) -> Path:
    return sorted((run_dir / "checkpoints").glob("step_*"))[-1]


def reference_losses(devices: int, workdir: Path, cache: dict) -> list[float]:
    """The CPU float32 single_device losses for the global batch of `devices` processes."""
    if devices not in cache:
        out = workdir / f"reference-{devices}"
        result, _ = _run([*BASE, "accelerator=cpu", "strategy=single_device", f"data.batch_size={8 * devices}",
                          f"trainer.max_steps={STEPS}", f"hydra.run.dir={out}"], workdir)
        if result.returncode:
            raise RuntimeError(f"the CPU reference run failed: {result.stderr[-2000:]}")
        cache[devices] = _losses(out)
    return cache[devices]


def check(row: Row, accelerator: str, reference: list[float], workdir: Path) -> dict:
    name = f"{row.strategy}-{row.precision}-{row.checkpoint_io}-{row.devices}-{len(list(workdir.iterdir()))}"
    args = [*BASE, f"accelerator={accelerator}", f"strategy={row.strategy}", f"precision={row.precision}",
            f"checkpoint_io={row.checkpoint_io}", f"devices={row.devices}", *row.extra]
    result, seconds = _run([*args, f"trainer.max_steps={STEPS}", f"hydra.run.dir={workdir / name}"], workdir)
    if result.returncode != 0:
        first = next((line for line in result.stderr.splitlines() if line.strip()), "")
        refused = result.returncode == 2 and "configuration error" in result.stderr
        detail = result.stderr.split("configuration error:", 1)[-1].strip().splitlines() if refused else [first]
        reason = " ".join(line.strip(" -") for line in detail[:2])[:200]
        return {"result": "refused" if refused else f"FAILED (exit {result.returncode})", "why": reason,
                "seconds": seconds}
    losses = _losses(workdir / name)
    diff = abs(losses[-1] - reference[-1])
    ok = diff <= TOLERANCE.get(row.precision, 0.15) and losses[-1] < losses[0]
    outcome = {"result": "ok" if ok else "LOSS OFF", "last": losses[-1], "diff": diff, "seconds": seconds, "why": ""}
    if row.resume and ok:
        resumed_dir = workdir / f"{name}-resumed"
        first, s1 = _run([*args, "trainer.max_steps=3", f"hydra.run.dir={resumed_dir}"], workdir)
        second, s2 = _run([*args, f"trainer.max_steps={STEPS}", "resume=auto", f"hydra.run.dir={resumed_dir}"],
                          workdir)
        outcome["seconds"] += s1 + s2
        if first.returncode or second.returncode:
            outcome.update(result="RESUME FAILED", why=(first.stderr or second.stderr).strip().splitlines()[-1][:160])
        else:
            exact = _losses(resumed_dir)[-3:] == losses[-3:]
            outcome.update(result="ok, resume exact" if exact else "RESUME DIFFERS",
                           why="" if exact else f"{_losses(resumed_dir)[-3:]} vs {losses[-3:]}")
    return outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="cuda", help="cuda (the check) or cpu (to check this script)")
    parser.add_argument("--rows", default="", help="comma-separated strategy/precision/checkpoint_io to run only")
    parser.add_argument("--devices", type=int, default=None, help="GPUs to use (default: all)")
    parser.add_argument("--out", default=None, help="write the table here instead of benchmarks/results/")
    args = parser.parse_args()
    if args.accelerator == "cuda" and not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "torch sees no CUDA GPU"
        print(f"gpu_check: {why} (torch {torch.__version__}); run it on a machine with NVIDIA GPUs "
              "(make gpu-check builds .venv-gpu with a CUDA build of torch).", file=sys.stderr)
        return 2
    gpus = args.devices or (torch.cuda.device_count() if args.accelerator == "cuda" else 2)
    wanted = set(filter(None, args.rows.split(",")))
    chosen = [r for r in rows(gpus) if not wanted or r.key in wanted]
    device = torch.cuda.get_device_name(0) if args.accelerator == "cuda" else "CPU (self-check of the script)"
    lines = [f"{device} x {gpus}, torch {torch.__version__}; GPT 2x64, {STEPS} steps, batch 8 x 64 tokens per "
             "process; the reference is the same job on the CPU in float32 (single_device). Run "
             f"{time.strftime('%Y-%m-%d')}.",
             "", "| strategy | precision | checkpoint_io | devices | note | result | last loss | vs CPU | seconds | why |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        workdir, cache = Path(tmp), {}
        failed = 0
        for row in chosen:
            out = check(row, args.accelerator, reference_losses(row.devices, workdir, cache), workdir)
            failed += out["result"].startswith(("FAILED", "LOSS", "RESUME"))
            last = f"{out['last']:.4f}" if "last" in out else ""
            diff = f"{out['diff']:.1e}" if "diff" in out else ""
            lines.append(f"| {row.strategy} | {row.precision} | {row.checkpoint_io} | {row.devices} | {row.note} | "
                         f"{out['result']} | {last} | {diff} | {out['seconds']:.0f} | {out['why']} |")
            print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    else:
        publish("gpu_check", lines)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
