"""What a strategy is and can do, in one object the compatibility table reads
(framework/config/compatibility.py): a strategy declares `abilities = Abilities(...)` with the
fields where it differs; a layout built of parts (the mesh strategy's appliers) combines its parts'."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

#: a flag the layout has only where every part allows it (a part may take it away)
PERMISSION = {"kind": "permission"}
#: a flag the layout has where any part needs it (a part may impose it)
REQUIREMENT = {"kind": "requirement"}


@dataclass(frozen=True)
class Abilities:
    """Each field's default is what a plain torch strategy (ddp, single_device) can do; each flag
    says whether it is a permission (PERMISSION: every part of a layout must allow it) or a
    requirement (REQUIREMENT: one part needing it makes the layout need it)."""

    manual_optimization: bool = field(default=True, metadata=PERMISSION)
    """A task may step several optimizers itself (not where an engine drives one optimizer)."""
    single_optimizer_reason: str = "drives one optimizer through its own engine"
    """Why not, as the refusal says it (where manual_optimization is False)."""
    loss_scaling: bool = field(default=True, metadata=PERMISSION)
    """precision=16's GradScaler can scale its backward (not where a schedule runs the backward)."""
    position_ids: bool = field(default=True, metadata=PERMISSION)
    """A batch's position_ids (packed rows) reach the model (not where stages pass one tensor on)."""
    sharded_state: bool = field(default=True, metadata=PERMISSION)
    """`sharded_state_dict` hands out each rank's own part (else full state, for checkpoint_io=dcp)."""
    float64: bool = field(default=True, metadata=PERMISSION)
    """precision=64 (DeepSpeed has no float64 mode)."""
    true_half_precision: bool = field(default=True, metadata=PERMISSION)
    """precision=16_true and bf16_true (DeepSpeed always keeps float32 master weights)."""
    fp16_needs_device_support: bool = field(default=False, metadata=REQUIREMENT)
    """precision=16 only where the device computes fp16 natively (DeepSpeed)."""
    clip_grad_value: bool = field(default=True, metadata=PERMISSION)
    """trainer.clip_grad_value can be honoured (DeepSpeed clips by global norm only)."""
    compile: bool = field(default=True, metadata=PERMISSION)
    """trainer.compile can compile its units (not where an engine wraps the model, or XLA compiles)."""
    step_skipping: bool = field(default=True, metadata=PERMISSION)
    """trainer.on_nonfinite=skip can leave a step out (not where an engine clips and steps in one call)."""
    requires_cuda: bool = field(default=False, metadata=REQUIREMENT)
    """It needs accelerator=cuda (fairscale's FSDP)."""
    native_libraries: tuple[str, ...] = ()
    """Native libraries this configuration needs (ctypes names, e.g. "aio" for NVMe offload)."""
    pipeline_stages: bool = field(default=False, metadata=REQUIREMENT)
    """It runs the model in pipeline stages (the task must say how a batch is split: pipeline_split,
    summed_loss)."""
    splits_layers: bool = field(default=False, metadata=REQUIREMENT)
    """It splits layers across ranks (tensor parallelism): adapters and the chunked loss care."""
    collective_forward: bool = field(default=False, metadata=REQUIREMENT)
    """Its forward calls collectives (sharded weights gathered, split layers reduced, experts
    exchanged): every rank runs as many forwards, so a rank whose completions have all ended goes
    on decoding with the others (task=grpo's rollout)."""

    def combined(self, others: list[Abilities]) -> Abilities:
        """What a layout of parts can do: a permission where every part allows it, a requirement
        where any part needs it, the libraries of all, a reason from the first part that gives one."""
        merged = {}
        for each in fields(self):
            values = [getattr(a, each.name) for a in (self, *others)]
            kind = each.metadata.get("kind")
            if kind == "permission":
                merged[each.name] = all(values)
            elif kind == "requirement":
                merged[each.name] = any(values)
            elif isinstance(each.default, tuple):
                merged[each.name] = tuple(dict.fromkeys(v for value in values for v in value))
            else:
                merged[each.name] = next((v for v in values if v != each.default), each.default)
        return Abilities(**merged)
