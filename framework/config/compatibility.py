"""The one table of which plugin combinations are allowed.

Each rule sees a `Plan` (the built plugins plus the facts they depend on: framework/config/plan_facts.py)
and either refuses the combination, naming the keys and a working alternative, or warns. Nothing
else in the framework decides compatibility; add a row here rather than an `if` elsewhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from framework.config import plan_facts
from framework.config.plan_facts import (
    Plan,
    _acc,
    _context_pipeline,
    _context_size,
    _expert_size,
    _flag,
    _groups,
    _max_processes,
    _missing_libraries,
    _missing_package,
    _prec,
    _quantized,
    _shared_gpus,
    _strat,
    _too_old,
    _xla_accelerator,
    _xla_only_plugins,
)
from framework.console import warn
from framework.errors import ConfigError, indivisible


@dataclass(frozen=True)
class Rule:
    applies: Callable[[Plan], bool]
    message: Callable[[Plan], str]
    level: str = "refuse"  # or "warn"


def _cp(p: Plan) -> str:
    return f"strategy.context_parallel_size={_context_size(p)}"


def _cp_uneven(p: Plan) -> list[str]:
    """Context parallelism's rows of data.block_size positions: 2 x C chunks each (a head and a tail a rank)."""
    length, chunks = p.loop.sequence_length, 2 * _context_size(p)
    if chunks == 2 or not p.loop.batch_split.sequence or not length:
        return []
    return indivisible(f"{_cp(p)} (x 2: a head and a tail chunk a rank)", chunks, length, f"data.block_size={length}",
                       f"choose a block_size that is a multiple of {chunks}.")


RULES: list[Rule] = [
    # context parallelism (framework/strategy/mesh/context.py): each a combination it does not serve
    Rule(
        lambda p: _context_size(p) > 1 and _flag(p, "pipeline", None) is not None,
        lambda p: f"{_cp(p)} with pipeline stages (strategy={_strat(p)}, pipeline_parallel_size resolved to "
        f"{_context_pipeline(p)}): a stage passes its activations alone to the next, and the split positions would "
        "have to travel with them; not supported yet: use context parallelism with fsdp, hsdp or tensor parallelism.",
    ),
    Rule(
        lambda p: _context_size(p) > 1 and _flag(p, "pipeline", None) is None and _expert_size(p) > 1,
        lambda p: f"{_cp(p)} with strategy.expert_parallel_size={_expert_size(p)}: the experts' token groups are the "
        "shard ranks', not yet the shard x context ranks; set one of them to 1.",
    ),
    Rule(
        lambda p: _context_size(p) > 1 and p.loop.compile,
        lambda p: f"{_cp(p)} with trainer.compile=true: the attention's interception (a TorchFunctionMode) is not "
        "traced by torch.compile here; set trainer.compile=false.",
    ),
    Rule(
        lambda p: _context_size(p) > 1 and p.loop.generates,
        lambda p: f"{_cp(p)} with task {p.loop.task}: it samples completions token by token inside the loop, and each "
        "new token attends to the whole sequence before it, which context parallelism splits over its ranks; the "
        "decoding of a split sequence is not built. Set strategy.context_parallel_size=1 (fsdp or tensor parallelism "
        "shard the model for a rollout).",
    ),
    Rule(
        lambda p: _context_size(p) > 1 and not p.loop.batch_split.sequence and not p.loop.generates,
        lambda p: f"{_cp(p)} with task {p.loop.task}: only a language model's batches (token sequences whose labels "
        "can be shifted before the split) are split along the sequence; set strategy.context_parallel_size=1.",
    ),
    Rule(
        lambda p: bool(_cp_uneven(p)),
        lambda p: _cp_uneven(p)[0],
    ),
    Rule(
        lambda p: p.mode == "predict" and _context_size(p) > 1,
        lambda p: f"framework predict with strategy.context_parallel_size={_context_size(p)}: each rank would see a "
        "share of every row and write a part of its prediction; predict with strategy.context_parallel_size=1 (the "
        "checkpoint loads at any layout).",
    ),
    Rule(
        lambda p: p.loop.on_nonfinite == "skip" and not p.strategy.abilities.step_skipping,
        lambda p: f"trainer.on_nonfinite=skip with strategy={_strat(p)}: its engine clips and steps in one call, "
        "so there is no point at which to leave a step out (its fp16 loss scaler still skips overflowing steps); "
        "use trainer.on_nonfinite=stop or warn, or a torch strategy (ddp, fsdp) to skip.",
    ),
    Rule(
        lambda p: p.loop.on_nonfinite == "skip" and p.loop.manual_optimization,
        lambda p: "trainer.on_nonfinite=skip with a task that steps its optimizers itself (manual optimization): the "
        "loop takes no optimizer step to leave out; use trainer.on_nonfinite=stop or warn (the task may skip a "
        "step itself).",
    ),
    Rule(
        lambda p: p.loop.compile and not p.strategy.abilities.compile,
        lambda p: f"trainer.compile=true with strategy={_strat(p)}: "
        + ("XLA compiles the whole step itself" if p.strategy.spmd or "xla" in _strat(p) else
           "its engine wraps and drives the model's modules itself")
        + "; use strategy=single_device, ddp, fsdp or hsdp to compile, or trainer.compile=false.",
    ),
    Rule(
        lambda p: p.loop.compile and not getattr(p.precision, "supports_compile", True),
        lambda p: f"trainer.compile=true with precision={_prec(p)}: its layers run kernels of their own that "
        "torch.compile does not trace; use trainer.compile=false, or a precision such as bf16 or 32.",
    ),
    Rule(
        lambda p: p.loop.loss_chunked and p.strategy.abilities.pipeline_stages,
        lambda p: f"task.loss_chunk_tokens with strategy={_strat(p)} and pipeline stages: the last stage's loss is "
        "computed by the schedule from that stage's whole logits (framework/strategy/mesh/pipeline/run.py), which "
        "the chunked head does not reach; set task.loss_chunk_tokens=null, or use strategy=fsdp.",
    ),
    Rule(
        lambda p: p.loop.loss_chunked and p.strategy.abilities.splits_layers and not p.strategy.abilities.pipeline_stages,
        lambda p: f"task.loss_chunk_tokens with strategy={_strat(p)}: under tensor parallelism the output head may be "
        "split over the vocabulary (Hugging Face's plans split lm_head), and a chunk's loss would then need the "
        "vocabulary-parallel cross-entropy, which is not built; set task.loss_chunk_tokens=null, or use strategy=fsdp.",
    ),
    Rule(
        lambda p: p.loop.adapter is not None and p.strategy.abilities.splits_layers,
        lambda p: f"adapter={p.loop.adapter} with strategy={_strat(p)}: the adapters wrap the very layers tensor "
        "parallelism splits, and their small matrices would have to be split the same way; use strategy=fsdp "
        "(or hsdp) to shard the frozen base, which is what an adapter run needs.",
    ),
    Rule(
        lambda p: p.loop.adapter is not None and getattr(p.checkpoint_io, "sharded", False),
        lambda p: f"adapter={p.loop.adapter} with checkpoint_io={p.names['checkpoint_io']}: an adapter's checkpoint "
        "holds its trainable weights alone (a few MB), written whole; use checkpoint_io=torch (or async).",
    ),
    Rule(
        lambda p: not p.accelerator.is_available(),
        lambda p: f"accelerator={_acc(p)}: {p.accelerator.unavailable_reason()} "
        "Use accelerator=cpu (or accelerator=auto to pick what this machine has)"
        + (f"; to plan the run for a machine that has it from here: framework plan --device {p.accelerator.name} "
           "--device-memory SIZE (one device's memory there, e.g. 80GiB) with the same overrides, "
           f"accelerator={_acc(p)} left out." if p.accelerator.name not in ("cpu", "auto") else "."),
    ),
    Rule(
        lambda p: p.accelerator.is_available() and p.devices > _max_processes(p),
        lambda p: f"devices={p.devices}: accelerator={_acc(p)} has only {p.accelerator.max_devices()} "
        f"device(s) on this machine" + (f", shared by at most {_max_processes(p)} processes"
                                         if _max_processes(p) > p.accelerator.max_devices() else "")
        + f"; use devices={_max_processes(p)} or fewer.",
    ),
    Rule(
        lambda p: p.accelerator.is_available() and p.accelerator.max_devices() < p.devices <= _max_processes(p),
        lambda p: f"devices={p.devices} on {p.accelerator.max_devices()} {_acc(p)} core(s): oversubscribed, the "
        "processes share the cores (one thread each); every rank runs, slower than with "
        f"devices={p.accelerator.max_devices()}.",
        level="warn",
    ),
    Rule(
        lambda p: _xla_accelerator(p) and not p.strategy.xla,
        lambda p: f"accelerator={_acc(p)} with strategy={_strat(p)}: XLA devices are driven by the XLA strategies; "
        "use strategy=single_xla (one device), xla_spmd (data parallel over devices) or xla_fsdp (sharded).",
    ),
    Rule(
        lambda p: p.strategy.xla and not _xla_accelerator(p),
        lambda p: f"strategy={_strat(p)} with accelerator={_acc(p)}: an XLA strategy needs accelerator=xla (the TPU, "
        "or XLA on the CPU) or tpu; for this device use strategy=single_device, ddp or fsdp.",
    ),
    Rule(
        lambda p: _xla_only_plugins(p) and not _xla_accelerator(p),
        lambda p: f"{', '.join(_xla_only_plugins(p))} with accelerator={_acc(p)}: "
        f"{'this plugin serves' if len(_xla_only_plugins(p)) == 1 else 'these plugins serve'} XLA runs only "
        "(accelerator=xla or tpu, with torch_xla installed); for this device use checkpoint_io=torch (or async, dcp) "
        "and cluster=auto.",
    ),
    Rule(
        lambda p: p.strategy.xla and not p.strategy.spmd and p.devices > 1,
        lambda p: f"strategy={_strat(p)} drives one XLA device, but devices={p.devices}; use strategy=xla_spmd "
        "(data parallel) or xla_fsdp (sharded) for several, or devices=1.",
    ),
    Rule(
        lambda p: _xla_accelerator(p) and _prec(p) in ("16", "16_true"),
        lambda p: f"precision={_prec(p)} on accelerator={_acc(p)}: XLA here has no float16 loss scaling and TPUs "
        "compute in bfloat16; use precision=bf16 (autocast on the XLA device) or bf16_true.",
    ),
    Rule(
        lambda p: _acc(p) == "tpu" and _prec(p) == "64",
        lambda p: "precision=64 with accelerator=tpu: TPUs have no float64; use precision=32.",
    ),
    Rule(
        lambda p: p.world_size > 1 and not p.strategy.multi_process and not p.strategy.xla,
        lambda p: f"strategy={p.names['strategy']} runs one process, but devices={p.devices} x "
        f"num_nodes={p.num_nodes} asks for {p.world_size}; use devices=1 num_nodes=1, or a "
        "multi-process strategy.",
    ),
    Rule(
        lambda p: _acc(p) == "mps" and (p.world_size > 1 or p.strategy.multi_process),
        lambda p: f"accelerator=mps with strategy={_strat(p)}: MPS supports one process only (no collective "
        "backend); use strategy=single_device devices=1.",
    ),
    Rule(
        lambda p: p.num_nodes > 1 and not p.cluster.creates_processes_externally,
        lambda p: f"num_nodes={p.num_nodes} with cluster={p.names['cluster']}: the framework starts processes "
        "on this machine only; start one process per device on every node with torchrun, srun or "
        "mpirun (the cluster plugin then joins them), or use num_nodes=1.",
    ),
    Rule(
        lambda p: bool(_too_old(p)),
        lambda p: "; ".join(f"{key}={name} needs torch {version} or newer (this is torch {'.'.join(map(str, plan_facts.torch_version()))})"
                            for key, name, version in _too_old(p))
        + ": install a newer torch (`pip install 'torch>=2.9'`: the framework is tested from 2.9 up), or choose "
        "another option.",
    ),
    Rule(
        lambda p: p.strategy.abilities.requires_cuda and _acc(p) != "cuda",
        lambda p: f"strategy={_strat(p)} needs CUDA (fairscale's FSDP creates CUDA streams) and "
        f"accelerator={_acc(p)} has none; use strategy=fsdp (torch FSDP2), which runs everywhere.",
    ),
    Rule(
        lambda p: _flag(p, "sync_batchnorm", False) and _acc(p) != "cuda",
        lambda p: f"strategy.sync_batchnorm=true with accelerator={_acc(p)}: torch's SyncBatchNorm runs on "
        "CUDA only; set strategy.sync_batchnorm=false.",
    ),
    Rule(
        lambda p: _prec(p) == "64" and not p.strategy.abilities.float64,
        lambda p: f"strategy={_strat(p)} with precision=64: DeepSpeed has no float64 mode; use precision=32 "
        "(or strategy=ddp / fsdp for float64).",
    ),
    Rule(
        lambda p: _prec(p) in ("16_true", "bf16_true") and not p.strategy.abilities.true_half_precision,
        lambda p: f"strategy={_strat(p)} with precision={_prec(p)}: DeepSpeed always keeps float32 master "
        f"weights, so it has no true half precision; use precision={_prec(p).split('_')[0]} (its mixed mode).",
    ),
    Rule(
        lambda p: _prec(p) == "16" and p.strategy.abilities.fp16_needs_device_support and not p.accelerator.fast_fp16(),
        lambda p: f"strategy={_strat(p)} with precision=16 on accelerator={_acc(p)}: DeepSpeed refuses fp16 "
        "on a device without fp16 support; use precision=bf16.",
    ),
    Rule(
        lambda p: _flag(p, "offload_parameters", "none") != "none" and _flag(p, "stage", 3) != 3,
        lambda p: f"strategy.offload_parameters={p.strategy.offload_parameters} needs ZeRO stage 3, not "
        f"stage {p.strategy.stage}; use strategy=deepspeed_stage_3_offload.",
    ),
    Rule(
        lambda p: p.loop.clip_grad_value is not None and not p.strategy.abilities.clip_grad_value,
        lambda p: f"strategy={_strat(p)} with trainer.clip_grad_value: DeepSpeed clips by global norm only; "
        "use trainer.clip_grad_norm instead.",
    ),
    Rule(
        lambda p: "aio" in _missing_libraries(p),
        lambda p: f"strategy={_strat(p)}: NVMe offload needs the libaio library, which is not installed "
        "(Debian/Ubuntu: apt-get install libaio-dev); use strategy=deepspeed_stage_3_offload (CPU offload).",
    ),
    Rule(
        lambda p: getattr(p.precision, "loss_scaling", False) and not p.strategy.abilities.loss_scaling,
        lambda p: f"precision={_prec(p)} with strategy={_strat(p)}: its loss scaling multiplies the loss before "
        "backward, and the pipeline's schedule runs the backward of every microbatch inside its own step; use "
        "precision=bf16 (float32's range: no loss scaling needed) or bf16_true.",
    ),
    Rule(
        lambda p: p.strategy.abilities.pipeline_stages and p.loop.generates,
        lambda p: f"task {p.loop.task} with strategy={_strat(p)}: it samples completions inside the loop, one token a "
        "forward through the whole model, and pipeline stages run a model only in their schedule of microbatches "
        "(each stage on its own ranks, the last alone holding the logits that choose the next token); decoding through "
        "stages is not built. Use strategy=fsdp, deepspeed_stage_3, or model_parallel with tensor parallelism.",
    ),
    Rule(
        lambda p: p.strategy.abilities.pipeline_stages and p.loop.frozen_model and not p.loop.generates,
        lambda p: f"task {p.loop.task} with strategy={_strat(p)}: the task computes with a second, frozen model (a "
        "reference, a teacher) on the same whole sequences as the trained one, and pipeline stages pass a stage's "
        "activations alone, so the second model would need stages and a schedule of its own, which are not built; "
        "use strategy=fsdp (or model_parallel without pipeline_parallel_size) to shard both models.",
    ),
    Rule(
        lambda p: p.strategy.abilities.pipeline_stages and not p.loop.stage_split and not p.loop.manual_optimization
        and not p.loop.frozen_model and not p.loop.generates,  # said by the rows above
        lambda p: f"strategy={_strat(p)} runs the model in pipeline stages, but task {p.loop.task} does not say how a "
        "batch goes through stages; give it pipeline_split(batch) -> (the first stage's input, the targets) and "
        "summed_loss(outputs, targets) (framework/tasks/base.py), or use strategy=fsdp.",
    ),
    Rule(
        lambda p: p.strategy.abilities.pipeline_stages and p.loop.pooled_routing,
        lambda p: f"a Hugging Face mixture of experts' routing is counted over every layer at once (its balancing "
        "loss, router_aux_loss_coef, pools them into one product, as transformers computes it; its load is logged "
        f"from the same watch), but under strategy={_strat(p)} the layers lie on different pipeline stages; use "
        "strategy=fsdp (strategy.expert_parallel_size spreads its experts), or the built-in GPT's experts "
        "(model.moe: each layer's own routing and losses, which pipeline stages take).",
    ),
    Rule(
        lambda p: p.loop.position_ids and not p.strategy.abilities.position_ids,
        lambda p: f"data packs several samples in a row, kept apart by position_ids, but strategy={_strat(p)} passes "
        "only activations between its stages; set data.packing=false (one sample a row, padded), or use "
        "strategy=fsdp.",
    ),
    Rule(
        lambda p: _groups(p) and p.strategy.replica_groups_refusal,
        lambda p: f"fault_tolerance={p.names['fault_tolerance']} with strategy={_strat(p)}: "
        f"{p.strategy.replica_groups_refusal}. Inside replica groups use strategy=ddp, or a layout of fsdp, hsdp, "
        "model_parallel or pipeline; or fault_tolerance=none.",
    ),
    Rule(
        lambda p: _groups(p) and getattr(p.fault_tolerance, "process_group", None) == "nccl"
        and getattr(p.strategy, "cpu_offload", False),
        lambda p: f"fault_tolerance.process_group=nccl with strategy={_strat(p)} offloading to the CPU: the gradients "
        "the groups average live in host memory, which NCCL does not reach; use fault_tolerance.process_group=gloo.",
    ),
    Rule(
        lambda p: getattr(p.fault_tolerance, "process_group", None) == "nccl"
        and getattr(p.accelerator, "distributed_backend", None) != "nccl",
        lambda p: f"fault_tolerance.process_group=nccl with accelerator={_acc(p)}: NCCL joins GPUs; use "
        "fault_tolerance.process_group=gloo.",
    ),
    Rule(
        lambda p: getattr(p.fault_tolerance, "process_group", None) == "nccl" and _shared_gpus(p) is not None,
        lambda p: f"fault_tolerance.process_group=nccl with {p.fault_tolerance.replica_groups} replica groups x "
        f"devices={p.devices} on {_shared_gpus(p)} GPU(s): the groups would share GPUs, and one NCCL communicator "
        "cannot hold two ranks of one GPU; use fault_tolerance.process_group=gloo (shared GPUs, slower), or fewer "
        "groups or devices.",
    ),
    Rule(
        lambda p: getattr(p.fault_tolerance, "process_group", None) != "nccl" and _shared_gpus(p) is not None,
        lambda p: f"fault_tolerance.replica_groups={p.fault_tolerance.replica_groups} x devices={p.devices} on "
        f"{_shared_gpus(p)} GPU(s): the groups share GPUs (each takes the next {p.devices} in turn, starting over at "
        "the first), each GPU's memory and time split between them; fine for trying it out, slower than GPUs of "
        "their own.",
        level="warn",
    ),
    Rule(
        lambda p: p.loop.manual_optimization and _groups(p),
        lambda p: f"fault_tolerance={p.names['fault_tolerance']} with a task that steps its optimizers itself (a GAN): "
        "the replica groups vote on one optimizer step a step; use a task with one loss, or fault_tolerance=none.",
    ),
    Rule(
        lambda p: p.loop.manual_optimization and not p.strategy.abilities.manual_optimization,
        lambda p: f"strategy={_strat(p)} {p.strategy.abilities.single_optimizer_reason}, but the task steps its "
        "optimizers itself (manual optimization, e.g. a GAN); use strategy=ddp, "
        "strategy=fsdp or strategy=single_device.",
    ),
    Rule(
        lambda p: p.loop.manual_optimization and _flag(p, "ddp_kwargs", {}).get("find_unused_parameters")
        is False,
        lambda p: f"strategy={_strat(p)} with a task that steps its optimizers itself: each optimizer's step leaves "
        "the other parameters without gradients, which DDP must be told; set strategy.find_unused_parameters=true "
        "(or null, which chooses it for such tasks).",
    ),
    Rule(
        lambda p: p.loop.manual_optimization and p.loop.accumulate > 1,
        lambda p: f"trainer.accumulate={p.loop.accumulate} with a task that steps its optimizers itself: the task "
        "decides when to step (accumulate inside its training_step); set trainer.accumulate=1.",
    ),
    Rule(
        lambda p: _missing_package(p) is not None,
        lambda p: f"precision={_prec(p)} needs the {_missing_package(p)} package, which is not installed; "
        f"{getattr(p.precision, 'install_hint', 'pip install ' + str(_missing_package(p)))} (or choose another "
        "precision).",
    ),
    Rule(
        lambda p: _prec(p) == "te_fp8" and p.accelerator.fp8_support() is not None,
        lambda p: f"precision=te_fp8 on accelerator={_acc(p)}: {p.accelerator.fp8_support()}. TransformerEngine's "
        "fp8 needs accelerator=cuda on a GPU of compute capability 8.9 or later; use precision=bf16 here.",
    ),
    Rule(
        lambda p: _prec(p) == "te_fp8" and _strat(p) not in ("single_device", "ddp", "ddp_spawn", "fsdp"),
        lambda p: f"precision=te_fp8 with strategy={_strat(p)}: only single_device, ddp, ddp_spawn and fsdp are "
        "wired to TransformerEngine's layers here (DeepSpeed and fairscale manage precision themselves); use one "
        "of those.",
    ),
    Rule(
        lambda p: _quantized(p) and p.strategy.shards_states,
        lambda p: f"precision={_prec(p)} with strategy={_strat(p)}: the quantized layers' frozen weights are "
        "packed bytes with statistics beside them, which this strategy's sharding (flattening parameters into "
        "shards) would split; use strategy=ddp (each rank keeps the small quantized model) or single_device.",
    ),
    Rule(
        lambda p: _quantized(p) and getattr(p.precision, "compute_dtype_name", "") == "fp16"
        and not p.accelerator.fast_fp16(),
        lambda p: f"precision={_prec(p)} with precision.compute_dtype=fp16 on accelerator={_acc(p)}: this device has "
        "no fp16 hardware, so the quantized layers will compute many times slower than with "
        f"compute_dtype={'bf16' if p.accelerator.fast_bf16() else 'fp32'}.",
        level="warn",
    ),
    Rule(
        lambda p: _quantized(p) and _acc(p) not in ("cpu", "cuda"),
        lambda p: f"precision={_prec(p)} on accelerator={_acc(p)}: bitsandbytes' quantized layers run on CPU and "
        "CUDA here; use accelerator=cpu or cuda, or precision=bf16.",
    ),
    Rule(
        lambda p: _acc(p) == "mps" and p.names["precision"] == "64",
        lambda p: "precision=64 with accelerator=mps: MPS has no float64; use precision=32.",
    ),
    Rule(
        lambda p: p.names["precision"] in ("bf16", "bf16_true") and not p.accelerator.supports_bf16(),
        lambda p: f"precision={p.names['precision']}: accelerator={_acc(p)} has no bfloat16 support "
        "on this device; use precision=16 or precision=32.",
    ),
    Rule(
        lambda p: p.names["precision"] in ("16", "16_true") and not p.accelerator.fast_fp16(),
        lambda p: f"precision={p.names['precision']} on accelerator={_acc(p)}: this device has no "
        "fp16 hardware, so half precision will run many times slower than precision=32"
        f"{'; precision=bf16 is the fast mixed precision here' if p.accelerator.fast_bf16() else ''}.",
        level="warn",
    ),
    Rule(
        lambda p: p.names["precision"] in ("bf16", "bf16_true") and p.accelerator.supports_bf16()
        and not p.accelerator.fast_bf16(),
        lambda p: f"precision={p.names['precision']} on accelerator={_acc(p)}: this device has no "
        "bf16 hardware (AVX512-BF16 or AMX on a CPU), so bf16 math will run many times slower than "
        "precision=32"
        f"{'; precision=16 is the fast mixed precision here' if p.accelerator.fast_fp16() else ''}.",
        level="warn",
    ),
    Rule(
        lambda p: _quantized(p) and getattr(p.precision, "compute_dtype_name", "") == "bf16"
        and not p.accelerator.fast_bf16(),
        lambda p: f"precision={_prec(p)} with precision.compute_dtype=bf16 on accelerator={_acc(p)}: this device "
        "has no bf16 hardware, so the quantized layers will compute many times slower than with "
        "precision.compute_dtype=fp32.",
        level="warn",
    ),
]


def judge(plan: Plan) -> tuple[list[str], list[str]]:
    """(refusals, warnings): the message of every rule that applies to `plan`."""
    applying = [rule for rule in RULES if rule.applies(plan)]
    return ([rule.message(plan) for rule in applying if rule.level == "refuse"],
            [rule.message(plan) for rule in applying if rule.level == "warn"])


def check_compatibility(plan: Plan) -> None:
    """Raise one ConfigError listing every refusal; otherwise print every warning."""
    refusals, warnings = judge(plan)
    if refusals:
        raise ConfigError("\n".join(refusals))
    for warning in warnings:
        warn(warning)
