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
  single_device, ddp, fsdp, hsdp and model_parallel;
- pipeline (2 stages x FSDP2 where the GPUs pair up, else one stage) in 32, bf16 and 16 (refused),
  resumed from torch and dcp checkpoints, and compiled;
- fault_tolerance=torchft: 2 replica groups (each half the GPUs, or sharing the one there is) of
  ddp and of fsdp, the groups' average over gloo and over nccl (refused where groups share a GPU),
  their mean loss against the CPU's at the groups' global batch and their final weights equal; groups
  of tensor parallelism and of pipeline stages; and
  group 1 killed after step 3 of 30 (ddp; fsdp, whose heal writes into DTensors): restarted, healed
  from group 0, the same final weights;
- context parallelism (fsdp, 2 ranks a sequence), DPO and distillation (the reference, the teacher
  placed by fsdp, ZeRO-3 or tensor parallelism), the chunked loss, and GRPO (sampling inside the loop under ddp, fsdp, ZeRO-3 and tensor
  parallelism, and resumed between two iterations of a rollout);
- mixtures of experts (Row.job, JOBS): the GPT's 8 experts on one GPU in 32 and bf16 and compiled; under
  fsdp with the experts spread over the GPUs (strategy.expert_parallel_size, all-to-all over nccl)
  in 32 and bf16, resumed from dcp, compiled; under model_parallel beside 2-way tensor parallelism
  and beside 2 pipeline stages (tensor parallelism over all where the GPUs do not pair up); inside
  each of 2 replica groups; and Qwen3-MoE (model=hf_causal_lm) spread by transformers' own plan;
- performance (`--perf`, on by default on CUDA): a GPT of 12 x 768, context 1024, batch 16, bf16
  autocast, AdamW, clipping: steady ms per step (steps 15-55, a synchronised clock) of a raw PyTorch
  loop eager and with torch.compile(model), of the framework eager and with trainer.compile=true,
  and of Lightning (where installed) eager and compiled, as ratios to the raw loop; the
  framework's throughput meter against a synchronised clock, and model-FLOPs utilisation.
Every layout trains the reference's global batch (8 sequences a device): where ranks split layers or
stages instead of reading their own batch, data.batch_size grows to match. Rows the published table
(`--before`) does not show ok or refused run first, then the performance runs with the GPU to
themselves, then the rest; `--deadline S` starts nothing after S seconds (what is left is listed as
not run) and `--out` is rewritten as each row ends, so a run under a time limit keeps what it did.
A combination the compatibility table refuses is recorded as refused, with its reason; a failed
row shows the exception's own last line; a row whose CPU reference failed says NO REFERENCE and why,
and the others go on. Float precisions are compared with the same job on the
CPU in float32; a quantized one (bnb_*) and 16_true with the same precision on the CPU (bitsandbytes
computes on both; float16 Adam trains unlike float32 on every device). Independent rows run side by
side (`--parallel`, 6 on CUDA: 62 rows took 4 minutes on an H100 that way, about 15 one after
another). `--failed-logs DIR` keeps each failed row's whole output.

Writes benchmarks/results/gpu_check.md (a table: result, last loss, difference to the CPU's).

    python benchmarks/gpu_check.py                       (a machine with CUDA GPUs; ~5 minutes)
    python benchmarks/gpu_check.py --accelerator cpu --rows single_device/32/torch   (the script itself)
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_table import RESULTS, publish  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASE = ["model.n_layer=2", "model.n_embd=64", "model.n_head=4", "model.block_size=64", "model.dropout=0.0",
        "data.max_bytes=300000", "data.batch_size=8", "data.val_batch_size=16", "trainer.val_batches=1",
        "trainer.val_every=1000", "trainer.val_at_start=false", "trainer.log_every=1", "trainer.progress_bar=false",
        "trainer.plot=false", "callbacks.checkpoint.every_n_steps=3", "logger=csv"]
STEPS = 6
# How far the last loss may be from the CPU's reference (float32; OWN_REFERENCE: the same
# precision on the CPU), by precision
TOLERANCE = {"32": 2e-3, "16": 5e-2, "bf16": 5e-2, "16_true": 0.15, "bf16_true": 0.1, "bnb_int8": 2e-2,
             "bnb_nf4": 2e-2, "te_fp8": 0.15}
# compared with the same precision on the CPU: the quantized ones, and 16_true (Adam's second
# moments underflow in float16, so it trains unlike float32 on every device: 0.38 off float32's
# loss after 6 steps on the CPU, 0.35 on an H100; the two devices' float16 0.13 apart)
OWN_REFERENCE = ("bnb_int8", "bnb_nf4", "16_true")
# the same hyper-parameters as conf/optimizer/adamw.yaml
DEEPSPEED_OWN_OPTIMIZER = ("+strategy.config.optimizer={type: AdamW, params: {lr: 0.003, betas: [0.9, 0.99], "
                           "weight_decay: 0.01}}")
MULTI = ["ddp", "ddp_spawn", "fsdp", "fsdp_cpu_offload", "hsdp", "model_parallel", "ddp_sharded", "fairscale_fsdp",
         "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_2_offload", "deepspeed_stage_3",
         "deepspeed_stage_3_offload"]
COMPILED = ["trainer.compile=true"]
# The models a row trains (Row.job), as overrides after BASE's: the dense GPT; its mixture of
# experts (framework/models/moe.py: 8 experts, top-2, in both Blocks, the balancing loss); Qwen3-MoE
# through transformers (conf/model/config/qwen3_moe.yaml: 2 layers of 8 experts, top-2)
EXPERTS = 8
TEXT_DATA = ("data.max_bytes=",)  # BASE's keys of the text corpus, which other data modules lack
JOBS = {"": BASE,
        "moe": [*BASE, f"model.moe.num_experts={EXPERTS}", "model.moe.top_k=2"],
        "qwen3_moe": [*(o for o in BASE if not o.startswith("model.")), "model=hf_causal_lm", "model/config=qwen3_moe",
                      "data.block_size=64"],
        # DPO against a frozen reference placed by the strategy (data=preference_files' own example pairs)
        "dpo": [*(o for o in BASE if not o.startswith(TEXT_DATA + ("model.block_size=",))), "task=preference",
                "data=preference_files", "model.block_size=256", "data.shuffle=false"],
        # GRPO: completions sampled inside the loop (seeded by prompt and step: every device draws the
        # same ones from the same probabilities), an exact-match and a length reward, a reference (beta)
        "grpo": [*(o for o in BASE if not o.startswith(TEXT_DATA)), "task=grpo", "data=prompt_files",
                 "data.max_prompt_tokens=16", "task.num_generations=4", "task.max_completion_tokens=8",
                 "task.stop='\\n'", "task.rewards=[exact_match,length]", "task.beta=0.04"]}
JOBS["grpo_iterations"] = [*JOBS["grpo"], "task.num_iterations=2"]  # a rollout trained 2 steps
JOBS["chunked"] = [*BASE, "task.loss_chunk_tokens=48"]  # the head and the loss 48 tokens at a time
# distillation from a teacher of another width (a random Hugging Face Llama over the same 256 byte
# ids, written once into the work folder: teacher_directory), placed by the strategy beside the student
TEACHER = "<teacher>"
JOBS["distillation"] = [*BASE, "task=distillation", f"task.teacher={TEACHER}", "task.temperature=2.0"]
# jobs whose loss need not fall in a few steps (a policy-gradient loss: advantages, not a likelihood)
LOSS_NEED_NOT_FALL = ("grpo", "grpo_iterations")
# and whose loss is small (about 1e-4 to 1e-2): a tolerance of its own, which a token drawn otherwise exceeds
JOB_TOLERANCE = {"grpo": 1e-5, "grpo_iterations": 1e-5}


@dataclass
class Row:
    strategy: str
    precision: str
    checkpoint_io: str
    devices: int
    extra: list = field(default_factory=list)
    note: str = ""
    resume: bool = False
    groups: int = 1  # fault_tolerance=torchft's replica groups (devices is each group's)
    heal: bool = False  # group 1 is killed mid-run and must heal
    steps: int = STEPS
    job: str = ""  # a key of JOBS: the model trained (its CPU reference trains the same one)

    @property
    def key(self) -> str:
        groups = ("/torchft-heal" if self.heal else "/torchft") if self.groups > 1 else ""
        return f"{self.strategy}/{self.precision}/{self.checkpoint_io}{groups}{'/' + self.job if self.job else ''}"

    @property
    def identity(self) -> tuple[str, ...]:
        """The table's first five columns, which tell its rows apart."""
        return self.strategy, self.precision, self.checkpoint_io, str(self.devices), self.note

    @property
    def reference_devices(self) -> int:
        """The processes whose global batch the CPU reference takes (every group's)."""
        return self.devices * self.groups


def rows(gpus: int) -> list[Row]:
    out = [Row("single_device", p, "torch", 1) for p in TOLERANCE]
    out += [Row("single_device", p, "torch", 1, note="moe", job="moe") for p in ("32", "bf16")]
    for devices in sorted({1, gpus} if gpus == 1 else {gpus}):
        for strategy in MULTI:
            for precision in ("32", "bf16", "16"):
                out.append(Row(strategy, precision, "torch", devices, layout_batch(strategy, devices)))
        for stage in ("deepspeed_stage_2", "deepspeed_stage_3"):
            out.append(Row(stage, "bf16", "torch", devices, [DEEPSPEED_OWN_OPTIMIZER], "DeepSpeed's own AdamW"))
        for strategy in ("ddp", "fsdp", "deepspeed_stage_3", "model_parallel"):
            for io in ("torch", "async", "dcp"):
                out.append(Row(strategy, "32", io, devices, layout_batch(strategy, devices), "3 steps + resume + 3",
                               resume=True))
        out.append(Row("model_parallel", "bf16", "torch", devices,
                       ["strategy.sequence_parallel=true", *layout_batch("model_parallel", devices)], "sequence parallel"))
        stages = pipeline_stages(devices)
        for precision in ("32", "bf16", "16"):  # 16: refused (its loss scaling cannot reach the schedule's backward)
            out.append(Row("pipeline", precision, "torch", devices, stages, "pipeline stages"))
        for io in ("torch", "dcp"):
            out.append(Row("pipeline", "32", io, devices, stages, "3 steps + resume + 3", resume=True))
        out.append(Row("pipeline", "bf16", "torch", devices, [*stages, *COMPILED], "trainer.compile=true"))
        for strategy in ("ddp", "fsdp", "hsdp", "model_parallel"):
            out.append(Row(strategy, "bf16", "torch", devices, [*layout_batch(strategy, devices), *COMPILED],
                           "trainer.compile=true"))
        out += replica_group_rows(devices)
        out += expert_rows(devices)
        out += second_model_rows(devices)
    out.append(Row("single_device", "32", "torch", 1, COMPILED, "trainer.compile=true"))
    out.append(Row("single_device", "bf16", "torch", 1, COMPILED, "moe, trainer.compile=true", job="moe"))
    return out


def global_batch(devices: int, data_parallel: int) -> list[str]:
    """data.batch_size for a layout where only `data_parallel` of the `devices` ranks read their own
    batch (the others split layers or stages), so that the global batch is the reference's (8 a
    device); nothing where every rank reads its own."""
    return [] if data_parallel == devices else [f"data.batch_size={8 * devices // data_parallel}"]


def layout_batch(strategy: str, devices: int) -> list[str]:
    """model_parallel's tensor parallelism spans the devices of a node by default (one batch for
    all of them); every other strategy's ranks each read their own."""
    return global_batch(devices, 1) if strategy == "model_parallel" else []


REPLICA_GROUPS = ["fault_tolerance=torchft", "fault_tolerance.replica_groups=2", "fault_tolerance.heartbeat_timeout_ms=1000",
                  "fault_tolerance.join_timeout_ms=200", "fault_tolerance.quorum_timeout_s=180"]
HEAL = ["+callbacks.killer._target_=tests.helpers.killer.KillReplicaGroupOnce", "+callbacks.killer.step=3",
        "+callbacks.pace._target_=tests.helpers.killer.PaceWhileAlone", "+callbacks.pace.seconds=1.0"]


def replica_group_rows(devices: int) -> list[Row]:
    """fault_tolerance=torchft at `devices` GPUs: 2 groups of half of them each (of the one GPU,
    shared, where there is one; nccl between groups is then refused), of ddp, fsdp, tensor
    parallelism and pipeline stages."""
    each = max(1, devices // 2)
    nccl = [*REPLICA_GROUPS, "fault_tolerance.process_group=nccl"]
    return [Row("ddp", "32", "torch", each, REPLICA_GROUPS, "2 replica groups, gloo between", groups=2),
            Row("fsdp", "bf16", "torch", each, REPLICA_GROUPS, "2 replica groups, gloo between", groups=2),
            Row("ddp", "32", "torch", each, nccl, "2 replica groups, nccl between", groups=2),
            Row("fsdp", "bf16", "torch", each, nccl, "2 replica groups, nccl between", groups=2),
            Row("ddp", "32", "torch", each, [*REPLICA_GROUPS, *HEAL], "group 1 killed after step 3, heals", groups=2,
                heal=True, steps=30),
            # the heal writes group 0's sharded state into the restarted group's DTensors on the GPU
            Row("fsdp", "bf16", "torch", each, [*REPLICA_GROUPS, *HEAL], "group 1 killed after step 3, heals",
                groups=2, heal=True, steps=30),
            # groups whose ranks split layers or stages: the average and the heal go part by part
            Row("model_parallel", "bf16", "torch", each, [*REPLICA_GROUPS, *layout_batch("model_parallel", each)],
                "2 replica groups of tensor parallelism", groups=2),
            Row("pipeline", "bf16", "torch", each, [*REPLICA_GROUPS, *pipeline_stages(each)],
                "2 replica groups of pipeline stages", groups=2)]


def expert_rows(devices: int) -> list[Row]:
    """Mixtures of experts at `devices` GPUs: the built-in GPT's experts spread over the ranks
    (strategy.expert_parallel_size: tokens dispatched by all-to-all) under fsdp, resumed from DCP
    and compiled; beside tensor parallelism and pipeline stages under model_parallel; inside each of
    2 replica groups; and Qwen3-MoE's experts spread by transformers' own plan."""
    ep = math.gcd(devices, EXPERTS)
    spread, over = [f"strategy.expert_parallel_size={ep}"], f"experts over {ep} rank(s)"
    out = [Row("fsdp", p, "torch", devices, spread, f"moe, {over}", job="moe") for p in ("32", "bf16")]
    out.append(Row("fsdp", "32", "dcp", devices, spread, f"moe, {over}, 3 steps + resume + 3", resume=True, job="moe"))
    out.append(Row("fsdp", "bf16", "torch", devices, [*spread, *COMPILED], f"moe, {over}, trainer.compile=true",
                   job="moe"))
    if devices % 2 == 0:  # halves: 2-way tensor parallelism or 2 stages, the experts over the other half
        half = math.gcd(devices // 2, EXPERTS)
        for split, what in (("strategy.tensor_parallel_size=2", "tensor parallel 2"),
                            ("strategy.pipeline_parallel_size=2", "2 pipeline stages")):
            out.append(Row("model_parallel", "bf16", "torch", devices,
                           [split, f"strategy.expert_parallel_size={half}", *global_batch(devices, devices // 2)],
                           f"moe, {what} x experts over {half} rank(s)", job="moe"))
    else:  # tensor parallel over every device, each holding every expert
        out.append(Row("model_parallel", "bf16", "torch", devices, layout_batch("model_parallel", devices),
                       "moe, tensor parallel, experts whole", job="moe"))
    each = max(1, devices // 2)
    out.append(Row("fsdp", "bf16", "torch", each, [*REPLICA_GROUPS, f"strategy.expert_parallel_size={math.gcd(each, EXPERTS)}"],
                   f"moe, 2 replica groups, experts over {math.gcd(each, EXPERTS)} rank(s) in each", groups=2, job="moe"))
    out.append(Row("fsdp", "bf16", "torch", devices, spread, f"qwen3_moe, {over} by transformers' plan",
                   job="qwen3_moe"))
    return out


def second_model_rows(devices: int) -> list[Row]:
    """Context parallelism (fsdp, each sequence split over 2 ranks: its masked pieces' CUDA path),
    DPO with the reference and distillation with the teacher placed beside the trained model, the
    chunked loss (task.loss_chunk_tokens), and GRPO (generation inside the loop;
    float32: bf16's rounding would draw other tokens than the CPU's) under the layouts that can run
    them, at `devices` GPUs."""
    out = []
    if devices % 2 == 0:
        context = ["strategy.context_parallel_size=2", *global_batch(devices, devices // 2)]
        out += [Row("fsdp", p, "torch", devices, context, "context parallel 2") for p in ("32", "bf16")]
    for strategy in ("fsdp", "deepspeed_stage_3", "model_parallel"):
        out.append(Row(strategy, "bf16", "torch", devices, layout_batch(strategy, devices), "dpo", job="dpo"))
    for strategy in ("fsdp", "deepspeed_stage_3", "model_parallel"):
        out.append(Row(strategy, "bf16", "torch", devices, layout_batch(strategy, devices), "distillation",
                       job="distillation"))
    for strategy in ("fsdp", "deepspeed_stage_3", "model_parallel"):  # model_parallel: refused (a split head)
        out.append(Row(strategy, "bf16", "torch", devices, layout_batch(strategy, devices), "chunked loss",
                       job="chunked"))
    for strategy in ("ddp", "fsdp", "deepspeed_stage_3", "model_parallel"):
        out.append(Row(strategy, "32", "torch", devices, layout_batch(strategy, devices), "grpo", job="grpo"))
    out.append(Row("fsdp", "32", "dcp", devices, [], "grpo, 2 iterations a rollout, 3 steps + resume + 3", resume=True,
                   job="grpo_iterations"))
    return out


def pipeline_stages(devices: int) -> list[str]:
    """strategy=pipeline's settings at `devices` GPUs: 2 stages x FSDP2 over the rest where they pair
    up (the base GPT has 2 blocks), each data-parallel group's batch doubled so that the global
    batch is the reference's (8 a device); one stage over every GPU otherwise."""
    if devices > 1 and devices % 2 == 0:
        return ["strategy.pipeline_parallel_size=2", *global_batch(devices, devices // 2)]
    return ["strategy.pipeline_parallel_size=1"]


def failure_reason(stderr: str) -> str:
    """The exception's own last line (not Hydra's "Error executing job with overrides"): the
    framework's first-failure line, else the last line that names an exception."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    first = next((line for line in lines if line.startswith("error: worker rank")), None)
    if first:
        return first.removeprefix("error: ")
    named = [line for line in lines if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b", line)]
    return (named or [line for line in lines if not line.startswith("Error executing job")] or [""])[-1]


def refusal(returncode: int, stderr: str) -> str | None:
    """The reason the framework refused the run before it trained (its configuration error: exit 2
    and a paragraph; under HYDRA_FULL_ERROR=1 or debug=true, a traceback of its ConfigError), else None."""
    if returncode == 2 and "configuration error:" in stderr:
        detail = stderr.split("configuration error:", 1)[1].strip().splitlines()
        return " ".join(line.strip(" -") for line in [d for d in detail if not d.startswith("(set debug")][:2])
    reason = failure_reason(stderr)
    if reason.startswith("framework.errors.ConfigError: "):
        return reason.removeprefix("framework.errors.ConfigError: ")
    return None


_teacher_lock = threading.Lock()


def teacher_directory(workdir: Path) -> Path:
    """The distillation rows' teacher: a Llama of 2 layers x 96, random weights (seed 0), saved once."""
    folder = workdir / "teacher"
    with _teacher_lock:
        if not (folder / "config.json").exists():
            import transformers

            transformers.logging.disable_progress_bar()
            torch.manual_seed(0)
            config = transformers.LlamaConfig(vocab_size=256, hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256)
            transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def _run(args: list[str], cwd: Path, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    if any(TEACHER in a for a in args):
        args = [a.replace(TEACHER, str(teacher_directory(cwd))) for a in args]
    started = time.time()
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=cwd, capture_output=True, text=True,
                            timeout=900, env={**os.environ, **(env or {})})
    return result, time.time() - started


def _losses(run_dir: Path) -> list[float]:
    """The run's train/loss by step; replica groups' (each its own share's) averaged over the groups,
    which is the loss of their global batch."""
    groups = sorted(run_dir.glob("replica_*"))
    if groups:
        each = [_losses(group) for group in groups]
        return [sum(step) / len(step) for step in zip(*each)]
    with open(run_dir / "metrics.csv") as f:
        return [float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")]


def replica_outcome(row: Row, run_dir: Path) -> str:
    """Why a replica-group run is not right ('' when it is): the groups' final weights differ, or
    the killed group did not come back and heal."""
    summary = json.loads((run_dir / "summary.json").read_text())
    if not summary.get("weights_agree"):
        return "the groups' final weights differ"
    killed = summary["replica_groups"][1]
    heals = killed.get("replicas", {}).get("heals", [])
    if row.heal and (killed["starts"] != 2 or not heals):
        return f"group 1 started {killed['starts']} time(s), healed {len(heals)} time(s)"
    return ""


def _last_checkpoint(run_dir: Path) -> Path:
    return sorted((run_dir / "checkpoints").glob("step_*"))[-1]


def reference_precision(precision: str) -> str:
    return precision if precision in OWN_REFERENCE else "32"


def reference_key(row: Row) -> tuple[int, str, str]:
    """What a row's CPU reference depends on: the global batch's processes, the precision, the model."""
    return row.reference_devices, reference_precision(row.precision), row.job


def reference_losses(key: tuple[int, str, str], workdir: Path, env: dict | None = None) -> list[float]:
    """The CPU single_device losses of `key`'s model for the global batch of its processes, in
    float32 (a quantized precision: in that precision); RuntimeError saying why where the run failed."""
    devices, precision, job = key
    out = workdir / f"reference-{devices}-{precision}-{job or 'gpt'}"
    result, _ = _run([*JOBS[job], "accelerator=cpu", "strategy=single_device", f"data.batch_size={8 * devices}",
                      f"precision={precision}", f"trainer.max_steps={STEPS}", f"hydra.run.dir={out}"], workdir, env)
    if result.returncode:
        raise RuntimeError(f"the CPU reference ({devices} x 8 sequences, {precision}, {job or 'gpt'}) failed: "
                           f"{failure_reason(result.stderr)}")
    return _losses(out)


FAILED_LOGS: Path | None = None  # --failed-logs: each failed row's stderr is written there
_names = iter(range(1 << 30))
_names_lock = threading.Lock()


def check(row: Row, accelerator: str, reference: list[float], workdir: Path) -> dict:
    with _names_lock:
        number = next(_names)
    name = f"{row.strategy}-{row.precision}-{row.checkpoint_io}-{row.devices}-{number}"
    args = [*JOBS[row.job], f"accelerator={accelerator}", f"strategy={row.strategy}", f"precision={row.precision}",
            f"checkpoint_io={row.checkpoint_io}", f"devices={row.devices}", *row.extra]
    env = {"PYTHONPATH": str(ROOT), "FRAMEWORK_TRUST_ALLOW": "tests.helpers."} if row.heal else None  # its killer
    result, seconds = _run([*args, f"trainer.max_steps={row.steps}", f"hydra.run.dir={workdir / name}"], workdir, env)
    if result.returncode != 0:
        refused = refusal(result.returncode, result.stderr)
        if FAILED_LOGS is not None and refused is None:  # the whole traceback, for the note
            (FAILED_LOGS / f"{name}.log").write_text(" ".join(args) + "\n\n" + result.stderr[-20000:])
        return {"result": "refused" if refused is not None else f"FAILED (exit {result.returncode})",
                "why": (refused if refused is not None else failure_reason(result.stderr))[:240], "seconds": seconds}
    losses = _losses(workdir / name / "replica_0" if row.heal else workdir / name)
    if row.heal:  # group 0 stepped alone on its share while group 1 was away: no reference to meet
        why = replica_outcome(row, workdir / name) or ("" if losses[-1] < losses[0] else "the loss did not fall")
        return {"result": "HEAL FAILED" if why else "ok, healed", "last": losses[-1], "seconds": seconds, "why": why}
    diff = abs(losses[-1] - reference[-1])
    falls = losses[-1] < losses[0] or row.job in LOSS_NEED_NOT_FALL
    ok = diff <= JOB_TOLERANCE.get(row.job, TOLERANCE.get(row.precision, 0.15)) and falls
    outcome = {"result": "ok" if ok else "LOSS OFF", "last": losses[-1], "diff": diff, "seconds": seconds, "why": ""}
    differ = replica_outcome(row, workdir / name) if row.groups > 1 and ok else ""
    if differ:
        outcome.update(result="WEIGHTS DIFFER", why=differ)
    if row.resume and ok:
        resumed_dir = workdir / f"{name}-resumed"
        first, s1 = _run([*args, "trainer.max_steps=3", f"hydra.run.dir={resumed_dir}"], workdir)
        second, s2 = _run([*args, f"trainer.max_steps={STEPS}", "resume=auto", f"hydra.run.dir={resumed_dir}"],
                          workdir)
        outcome["seconds"] += s1 + s2
        if (first.returncode or second.returncode) and FAILED_LOGS is not None:
            (FAILED_LOGS / f"{name}-resumed.log").write_text(first.stderr[-20000:] + "\n\n" + second.stderr[-20000:])
        if first.returncode or second.returncode:
            outcome.update(result="RESUME FAILED", why=failure_reason(first.stderr or second.stderr)[:240])
        else:
            exact = _losses(resumed_dir)[-3:] == losses[-3:]
            outcome.update(result="ok, resume exact" if exact else "RESUME DIFFERS",
                           why="" if exact else f"{_losses(resumed_dir)[-3:]} vs {losses[-3:]}")
    return outcome


PERF_MODEL = {"cuda": ["model.n_layer=12", "model.n_embd=768", "model.n_head=12", "model.block_size=1024"],
              "cpu": ["model.n_layer=2", "model.n_embd=64", "model.n_head=4", "model.block_size=64"]}
PERF_BATCH = {"cuda": 16, "cpu": 8}
PERF_STEPS, PERF_FROM, PERF_TO = 60, 15, 55  # steady steps: after compilation and warm-up


def _perf_gpt(accelerator: str):
    from framework.models.gpt import GPT

    sizes = dict(item.removeprefix("model.").split("=") for item in PERF_MODEL[accelerator])
    return GPT(vocab_size=256, n_layer=int(sizes["n_layer"]), n_embd=int(sizes["n_embd"]),
               n_head=int(sizes["n_head"]), block_size=int(sizes["block_size"]), dropout=0.0)


def _mfu(accelerator: str, tokens_per_s: float) -> str:
    """The model-FLOPs utilisation of `tokens_per_s` on this device (framework/models/flops.py,
    framework/accelerator/peak_flops.py), as train/mfu computes it."""
    from framework.accelerator.peak_flops import peak_flops
    from framework.models.flops import training_flops_per_item

    model = _perf_gpt(accelerator)
    peak = peak_flops(torch.device(accelerator, 0) if accelerator == "cuda" else torch.device("cpu"), torch.bfloat16)
    if peak is None:
        return "unknown peak"
    return f"{tokens_per_s * training_flops_per_item(model, model.block_size) / peak:.1%}"


def _raw_step_ms(accelerator: str, compiled: bool) -> float:
    """A hand-written loop on the same GPT: bf16 autocast, AdamW, clipping; ms per step between
    steps PERF_FROM and PERF_TO, the device synchronised at both ends."""
    from torch.nn import functional as F

    torch.manual_seed(0)
    model = _perf_gpt(accelerator).to(accelerator)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.99), weight_decay=0.01)
    forward = torch.compile(model) if compiled else model
    tokens = torch.randint(0, 256, (PERF_BATCH[accelerator], model.block_size + 1), device=accelerator)
    sync = torch.cuda.synchronize if accelerator == "cuda" else (lambda: None)
    started = 0.0
    for step in range(PERF_TO):
        if step == PERF_FROM:
            sync()
            started = time.perf_counter()
        with torch.autocast(accelerator, dtype=torch.bfloat16):
            logits = forward(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sync()
    return (time.perf_counter() - started) * 1000 / (PERF_TO - PERF_FROM)


def _lightning_step_ms(accelerator: str, compiled: bool) -> tuple[float, str]:
    """PyTorch Lightning on the same GPT and loop (bf16-mixed, AdamW, clipping at 1.0), timed by
    a callback with the device synchronised at the end of steps PERF_FROM and PERF_TO."""
    try:
        import lightning as L
    except ImportError:
        return float("nan"), "lightning is not installed"
    from torch.nn import functional as F

    torch.manual_seed(0)
    model = _perf_gpt(accelerator)
    tokens = torch.randint(0, 256, (PERF_BATCH[accelerator] * PERF_STEPS, model.block_size + 1))
    stamps = {}

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = torch.compile(model) if compiled else model

        def training_step(self, batch, _):
            (row,) = batch
            logits = self.model(row[:, :-1])
            return F.cross_entropy(logits.flatten(0, 1).float(), row[:, 1:].flatten())

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=3e-3, betas=(0.9, 0.99), weight_decay=0.01)

    class Clock(L.Callback):
        def on_train_batch_end(self, trainer, *_):
            if trainer.global_step in (PERF_FROM, PERF_TO):
                torch.cuda.synchronize() if accelerator == "cuda" else None
                stamps[trainer.global_step] = time.perf_counter()

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens), batch_size=PERF_BATCH[accelerator])
    trainer = L.Trainer(accelerator=accelerator, devices=1, precision="bf16-mixed", max_steps=PERF_TO,
                        gradient_clip_val=1.0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[Clock()])
    trainer.fit(Module(), loader)
    return (stamps[PERF_TO] - stamps[PERF_FROM]) * 1000 / (PERF_TO - PERF_FROM), f"lightning {L.__version__}"


def _framework_step_ms(accelerator: str, compiled: bool, workdir: Path) -> tuple[float, str, str]:
    """The framework's own run of the same model: ms per step from its throughput meter over the
    windows between PERF_FROM and PERF_TO; a note holding its tokens/s, the meter against a
    synchronised clock around the same steps (benchmarks/step_timer.py SyncClock), and its
    logged train/mfu."""
    out = workdir / f"perf-{'compiled' if compiled else 'eager'}"
    clock_env = {"FRAMEWORK_TRUST_ALLOW": "step_timer.",  # the SyncClock callback, from benchmarks/
                 "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent),
                                                             os.environ.get("PYTHONPATH")]))}
    result, _ = _run([*PERF_MODEL[accelerator], f"accelerator={accelerator}", "precision=bf16", "model.dropout=0.0",
                      f"data.batch_size={PERF_BATCH[accelerator]}", f"trainer.max_steps={PERF_STEPS}",
                      "trainer.log_every=5", "trainer.val_at_start=false", "trainer.val_every=100000",
                      "trainer.progress_bar=false", "trainer.plot=false", "callbacks=[]", "logger=csv",
                      "+callbacks.clock._target_=step_timer.SyncClock", f"+callbacks.clock.first={PERF_FROM}",
                      f"+callbacks.clock.last={PERF_TO}",
                      f"trainer.compile={str(compiled).lower()}", f"hydra.run.dir={out}"], workdir, env=clock_env)
    if result.returncode:
        return float("nan"), failure_reason(result.stderr), ""
    with open(out / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/tokens_per_s")]
    window = [r for r in rows if PERF_FROM < int(r["step"]) <= PERF_TO]
    tokens = sum(float(r["train/tokens"]) - float(p["train/tokens"]) for p, r in zip(rows, rows[1:]) if r in window)
    seconds = sum((float(r["train/tokens"]) - float(p["train/tokens"])) / float(r["train/tokens_per_s"])
                  for p, r in zip(rows, rows[1:]) if r in window)
    steps = sum(5 for r in window)
    clock = json.loads((out / "clock.json").read_text())
    clock_rate = tokens / clock["seconds"]
    mfus = [float(r["train/mfu"]) for r in window if r.get("train/mfu")]
    mfu = f"{sum(mfus) / len(mfus):.1%}" if mfus else "not logged"
    return (seconds * 1000 / steps, f"{tokens / seconds:,.0f} tokens/s",
            f"meter / synchronised clock {tokens / seconds / clock_rate:.3f}; train/mfu {mfu}")


def performance(accelerator: str, workdir: Path) -> list[str]:
    tokens_per_step = PERF_BATCH[accelerator] * int(PERF_MODEL[accelerator][3].split("=")[1])
    raw = _raw_step_ms(accelerator, False)
    raw_compiled = _raw_step_ms(accelerator, True)
    print(f"raw loop: eager {raw:.2f} ms, compiled {raw_compiled:.2f} ms a step", flush=True)
    runs = [("raw PyTorch loop, eager", raw, f"{tokens_per_step / raw * 1000:,.0f} tokens/s",
             f"mfu {_mfu(accelerator, tokens_per_step / raw * 1000)}"),
            ("raw PyTorch loop, torch.compile(model)", raw_compiled,
             f"{tokens_per_step / raw_compiled * 1000:,.0f} tokens/s",
             f"mfu {_mfu(accelerator, tokens_per_step / raw_compiled * 1000)}")]
    for compiled in (False, True):
        ms, note, meter = _framework_step_ms(accelerator, compiled, workdir)
        runs.append((f"framework, trainer.compile={str(compiled).lower()}", ms, note, meter))
        print(runs[-1], flush=True)  # each as it ends: a run cut short by a time limit keeps them
    for compiled in (False, True):
        try:
            ms, note = _lightning_step_ms(accelerator, compiled)
        except Exception as error:  # a comparison, not the check: its failure is reported, not fatal
            ms, note = float("nan"), f"{type(error).__name__}: {error}"[:200]
        runs.append((f"Lightning, {'torch.compile(model)' if compiled else 'eager'}", ms, note, ""))
        print(runs[-1], flush=True)
    sizes = " ".join(PERF_MODEL[accelerator]).replace("model.", "")
    lines = ["", f"Steady step ({sizes}, batch {PERF_BATCH[accelerator]}, bf16 autocast, AdamW, clip 1.0; steps "
                 f"{PERF_FROM}-{PERF_TO}, synchronised clock; mfu: framework/models/flops.py's count over "
                 "framework/accelerator/peak_flops.py's peak):", "",
             "| run | ms/step | vs raw eager | vs raw compiled | throughput | meter, mfu |", "|---|---|---|---|---|---|"]
    lines += [f"| {name} | {ms:.1f} | {ms / raw:.2f}x | {ms / raw_compiled:.2f}x | {note} | {meter} |"
              for name, ms, note, meter in runs]
    return lines


FAILURES = ("FAILED", "LOSS", "RESUME", "HEAL", "WEIGHTS", "NO REFERENCE")
NOT_RUN = "not run (deadline)"


def ran_before(table: Path) -> set[tuple[str, ...]]:
    """The rows (their first five columns) a published GPU table shows ok or refused: the check runs
    every other row first, then the performance runs, then these."""
    if not table.exists():
        return set()
    cells = ([c.strip() for c in line.split("|")[1:-1]] for line in table.read_text().splitlines())
    # a table merged from two runs says so in the note ("...; run 2 (run 1: FAILED (exit 1))")
    return {(*row[:4], re.sub(r"(^|;\s*)run \d+ \(.*\)$", "", row[4])) for row in cells
            if len(row) == 10 and row[5].startswith(("ok", "refused"))}


def _line(row: Row, out: dict) -> str:
    last = f"{out['last']:.4f}" if "last" in out else ""
    diff = f"{out['diff']:.1e}" if "diff" in out else ""
    return (f"| {row.strategy} | {row.precision} | {row.checkpoint_io} | {row.devices} | {row.note} | "
            f"{out['result']} | {last} | {diff} | {out['seconds']:.0f} | {out['why']} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="cuda", help="cuda (the check) or cpu (to check this script)")
    parser.add_argument("--rows", default="", help="comma-separated keys (strategy/precision/checkpoint_io[/torchft]"
                                                   "[/job]) to run only")
    parser.add_argument("--devices", type=int, default=None, help="GPUs to use (default: all)")
    parser.add_argument("--parallel", type=int, default=None, help="rows run side by side (default: 6 on CUDA, 1 on "
                                                                   "the CPU)")
    parser.add_argument("--perf", choices=["on", "off"], default=None,
                        help="the performance rows (default: on for CUDA when every row is run)")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds after which no row (nor the performance runs) starts: those left are listed "
                             "as not run, so that a run under a time limit ends with its table")
    parser.add_argument("--before", default=str(RESULTS / "gpu_check.md"),
                        help="a GPU table whose ok and refused rows run last (default: the published one)")
    parser.add_argument("--out", default=None, help="write the table here instead of benchmarks/results/ (rewritten "
                                                    "as each row ends)")
    parser.add_argument("--failed-logs", default=None, help="a folder for each failed row's whole stderr")
    args = parser.parse_args()
    started = time.monotonic()
    if args.failed_logs:
        global FAILED_LOGS
        FAILED_LOGS = Path(args.failed_logs)
        FAILED_LOGS.mkdir(parents=True, exist_ok=True)
    if args.accelerator == "cuda" and not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "torch sees no CUDA GPU"
        print(f"gpu_check: {why} (torch {torch.__version__}); run it on a machine with NVIDIA GPUs "
              "(make gpu-check builds .venv-gpu with a CUDA build of torch).", file=sys.stderr)
        return 2
    gpus = args.devices or (torch.cuda.device_count() if args.accelerator == "cuda" else 2)
    every = rows(gpus)
    wanted = set(filter(None, args.rows.split(",")))
    unknown = wanted - {r.key for r in every}
    if unknown:
        print(f"gpu_check: no row has the key(s) {', '.join(sorted(unknown))} at {gpus} device(s)", file=sys.stderr)
        return 2
    chosen = [r for r in every if not wanted or r.key in wanted]
    parallel = args.parallel or (6 if args.accelerator == "cuda" else 1)
    perf = args.perf == "on" or (args.perf is None and args.accelerator == "cuda" and not wanted)
    seen = ran_before(Path(args.before))
    device = torch.cuda.get_device_name(0) if args.accelerator == "cuda" else "CPU (self-check of the script)"
    header = [f"{device} x {gpus}, torch {torch.__version__}; {STEPS} steps, batch 8 x 64 tokens per process of a GPT "
              "2x64 (job moe: its mixture of 8 experts; qwen3_moe: Qwen3-MoE's 2 layers of 8 experts through "
              "transformers); the reference is the same job on the CPU (single_device) in float32, or for bnb_* and "
              f"16_true in that precision. {parallel} row(s) side by side; the rows not shown ok in {args.before} ran "
              f"first. Run {time.strftime('%Y-%m-%d')}.",
              "", "| strategy | precision | checkpoint_io | devices | note | result | last loss | vs CPU | seconds | "
              "why |", "|---|---|---|---|---|---|---|---|---|---|"]
    target = Path(args.out) if args.out else RESULTS / "gpu_check.md"
    lines: dict[int, str] = {}  # the table's rows by their place in `chosen`, as they end
    results: dict[int, str] = {}
    perf_lines: list[str] = []
    lock = threading.Lock()

    def write(final: bool) -> None:
        table = [*header, *(lines[i] for i in sorted(lines)), *perf_lines]
        if not final:  # what a run killed by a time limit leaves
            table.insert(1, f"\nIn progress: {len(lines)} of {len(chosen)} rows ended.")
        if final and not args.out:
            publish("gpu_check", table)  # benchmarks/results/gpu_check.md, and printed
        else:
            target.write_text("\n".join(table) + "\n")

    def past_deadline() -> bool:
        return args.deadline is not None and time.monotonic() - started > args.deadline

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        # the CPU references side by side, the cores shared among them; a failed one marks its rows only
        threads = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // parallel))}

        def reference(key: tuple[int, str, str]) -> list[float] | RuntimeError:
            try:
                return reference_losses(key, workdir, threads)
            except RuntimeError as error:
                return error

        keys = sorted({reference_key(r) for r in chosen if not r.heal})
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            references = dict(zip(keys, pool.map(reference, keys)))

        def one(item: tuple[int, Row]) -> None:
            index, row = item
            expected = [] if row.heal else references[reference_key(row)]
            if past_deadline():
                outcome = {"result": NOT_RUN, "seconds": 0, "why": f"--deadline {args.deadline:g} s"}
            elif isinstance(expected, RuntimeError):  # nothing to compare with
                outcome = {"result": "NO REFERENCE", "seconds": 0, "why": str(expected)[:240]}
            else:
                try:
                    outcome = check(row, args.accelerator, expected, workdir)
                except Exception as error:  # this script's own failure on one row loses no other row
                    outcome = {"result": "FAILED (gpu_check)", "seconds": 0, "why": f"{type(error).__name__}: {error}"}
                print(_line(row, outcome), flush=True)
            with lock:
                lines[index], results[index] = _line(row, outcome), outcome["result"]
                write(final=False)

        first = [(i, r) for i, r in enumerate(chosen) if r.identity not in seen]
        last = [(i, r) for i, r in enumerate(chosen) if r.identity in seen]
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            list(pool.map(one, first))
        if perf and not past_deadline():  # the GPU to itself: between the two sets of rows
            try:
                perf_lines = performance(args.accelerator, workdir)
            except Exception as error:  # the rows' table still ends whole
                perf_lines = ["", f"The performance runs failed: {type(error).__name__}: {error}"]
            print("\n".join(perf_lines), flush=True)
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            list(pool.map(one, last))
    write(final=True)
    failed = sum(result.startswith(FAILURES) for result in results.values())
    not_run = list(results.values()).count(NOT_RUN)
    if failed or not_run:
        print(f"gpu_check: {failed} row(s) failed, {not_run} not run", file=sys.stderr)
    return 1 if failed or not_run else 0


if __name__ == "__main__":
    sys.exit(main())
