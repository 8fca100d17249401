"""What the loop will do, read from the config before any process starts: strategies that must
know it in advance (DeepSpeed's config) receive it, and the compatibility table judges it."""
from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from framework.batch_split import WHOLE_ROWS, BatchSplit
from framework.config.targets import import_target


@dataclass
class LoopSettings:
    """What the loop will do, for strategies that must know it in advance (DeepSpeed's config)."""

    micro_batch_size: int = 1
    accumulate: int = 1
    clip_grad_norm: float | None = None
    clip_grad_value: float | None = None
    manual_optimization: bool = False  # the task steps its optimizers itself (framework/tasks/manual.py)
    activation_checkpointing: bool = False  # recompute each unit's activations in backward
    adapter: str | None = None  # adapter=lora: only the adapters' weights train
    compile: bool = False  # torch.compile each unit (framework/construction/compile.py)
    on_nonfinite: str = "stop"  # trainer.on_nonfinite (framework/loop/nonfinite.py)
    position_ids: bool = False  # the batches carry position_ids (packed rows: several samples a row)
    task: str = ""  # the task's class name, as messages say it
    stage_split: bool = True  # the task says how a batch goes through pipeline stages (pipeline_split, summed_loss)
    # a Hugging Face mixture of experts: its routers watched as one pool over every layer (framework/models/hf_routers.py)
    pooled_routing: bool = False
    loss_chunked: bool = False  # task.loss_chunk_tokens: the head and the loss by chunks (framework/tasks/chunked_loss.py)
    batch_split: BatchSplit = WHOLE_ROWS  # how the task's batch may be cut (framework/batch_split.py)
    sequence_length: int | None = None  # data.block_size: the positions of a batch's rows
    frozen_model: bool = False  # the task computes with a second, frozen model (framework/tasks/frozen.py)
    generates: bool = False  # the task samples its training batches from the model in the loop (task.rollout)


def loop_settings(cfg: DictConfig) -> LoopSettings:
    """The loop settings of a resolved config (the task class says whether it steps its optimizers)."""
    task = import_target(cfg.task._target_, "task")
    data = import_target(cfg.data._target_, "data")
    packed = bool(getattr(data, "packs_with_position_ids", False) and cfg.data.get("packing", False))
    return LoopSettings(micro_batch_size=cfg.data.get("batch_size", 1), accumulate=cfg.trainer.accumulate,
                        clip_grad_norm=cfg.trainer.clip_grad_norm, clip_grad_value=cfg.trainer.clip_grad_value,
                        manual_optimization=not getattr(task, "automatic_optimization", True),
                        activation_checkpointing=bool(cfg.trainer.get("activation_checkpointing", False)),
                        compile=bool(cfg.trainer.get("compile", False)),
                        on_nonfinite=str(cfg.trainer.get("on_nonfinite", "stop")), position_ids=packed,
                        task=task.__name__, stage_split=getattr(task, "pipeline_split", None) is not None
                        and getattr(task, "summed_loss", None) is not None,
                        adapter=cfg.adapter._target_.rsplit(".", 1)[-1].lower() if cfg.get("adapter") else None,
                        pooled_routing=hf_routed(cfg), loss_chunked=cfg.task.get("loss_chunk_tokens") is not None,
                        batch_split=getattr(task, "batch_split", WHOLE_ROWS),
                        sequence_length=cfg.data.get("block_size"),
                        frozen_model=bool(getattr(task, "frozen_model", False)),
                        generates=getattr(task, "rollout", None) is not None)


def hf_routed(cfg: DictConfig) -> bool:
    """Whether the model is a Hugging Face mixture of experts (its config routes tokens to experts),
    whose routers are watched as one pool over every layer (framework/models/hf_routers.py)."""
    model = cfg.get("model")
    config = model.get("config") if isinstance(model, DictConfig) else None
    return bool(isinstance(config, DictConfig) and config.get("num_experts_per_tok"))
