"""Tensor-parallel plans: which layers split across the ranks of a tensor-parallel group, and how.

A plan maps module names (globs: `blocks.*.attn.qkv`) to the name of a style:

- `colwise`: a linear layer whose output features are split (each rank computes its share of the
  heads or of the hidden units); its input is whole on every rank.
- `rowwise`: a linear layer whose input features are split (the output of a `colwise` layer); the
  ranks' partial outputs are summed.
- `colwise_fused3`: `colwise` for a layer computing three projections at once (q, k and v): each
  third is split, so a rank holds its share of each (its heads' q, k and v).

With sequence parallelism (`strategy.sequence_parallel=true`) the activations between those
layers are split along the sequence instead of being whole on every rank, and the model's
`sequence_parallel` plan adds:

- `sequence_parallel`: a layer norm (or dropout) that runs on the rank's share of the positions;
- `split_sequence`: the module's input (whole) is split along the sequence (where it starts);
- `gather_sequence`: the module's input (split) is gathered whole again (where it ends).

Where a plan comes from (`plan_for`): the strategy's `tp_plan` (the user's, module names relative
to the model), else the model's own `tensor_parallel_plan` (the built-in GPT), else a Hugging
Face model's `base_model_tp_plan` in its config (Llama, Qwen2, Mistral, ...: `colwise` and
`rowwise` entries, prefixed with the base model's attribute name).
"""
from __future__ import annotations

import fnmatch
import functools
from typing import Callable

from torch import nn
from torch.nn import functional as F

from framework.errors import indivisible

#: styles of a plan without sequence parallelism, and those sequence parallelism adds
LINEAR_STYLES = ("colwise", "rowwise", "colwise_fused3")
SEQUENCE_STYLES = ("sequence_parallel", "split_sequence", "gather_sequence")
STYLES = LINEAR_STYLES + SEQUENCE_STYLES


def plan_for(model: nn.Module, user_plan: dict | None, sequence_parallel: bool) -> tuple[dict[str, str], str]:
    """(the plan as {glob: style}, where it came from); an empty plan when the model has none."""
    if user_plan:
        return dict(user_plan), "strategy.tp_plan"
    own = getattr(model, "tensor_parallel_plan", None)
    if own:
        plan = dict(own)
        if sequence_parallel:
            plan.update(getattr(model, "sequence_parallel_plan", {}) or {})
        return plan, f"{type(model).__name__}.tensor_parallel_plan"
    config = getattr(model, "config", None)
    hf_plan = getattr(config, "base_model_tp_plan", None)
    if hf_plan:
        prefix = getattr(model, "base_model_prefix", "")
        base = prefix if prefix and hasattr(model, prefix) else ""
        return ({f"{base}.{name}" if base else name: style for name, style in hf_plan.items()},
                f"{type(config).__name__}.base_model_tp_plan")
    return {}, ""


def expand(model: nn.Module, plan: dict[str, str]) -> dict[str, str]:
    """{module name: style} for every module the plan's globs match, in module order."""
    names = [name for name, _ in model.named_modules() if name]
    chosen: dict[str, str] = {}
    for pattern, style in plan.items():
        for name in names:
            if fnmatch.fnmatchcase(name, pattern):
                chosen[name] = style
    return {name: chosen[name] for name in names if name in chosen}


def head_counts(model: nn.Module) -> dict[str, int]:
    """The attention head counts tensor parallelism must divide ({what: count})."""
    config = getattr(model, "config", None)
    counts = {}
    for key in ("num_attention_heads", "num_key_value_heads", "n_head"):
        value = getattr(config, key, None)
        if isinstance(value, int):
            counts[f"model config's {key}"] = value
    if not counts:
        for module in model.modules():
            if isinstance(getattr(module, "n_head", None), int):
                counts["model.n_head"] = module.n_head
                break
    return counts


def plan_problems(model: nn.Module, plan: dict[str, str], source: str, size: int, sequence_parallel: bool,
                  size_label: str | None = None) -> list[str]:
    """What keeps `plan` from splitting `model` over `size` ranks: unknown styles, globs that match
    nothing, a style on the wrong kind of layer, dimensions or heads `size` does not divide.
    `size_label`: how the user gave the size (e.g. 'auto (2)'), for the messages."""
    size_label = size_label or str(size)
    if not plan:
        return [f"strategy=model_parallel: {type(model).__name__} has no tensor-parallel plan (the built-in GPT and "
                "Hugging Face models whose config has a base_model_tp_plan, such as Llama and Qwen2, do). Give one: "
                "strategy.tp_plan={'layers.*.q_proj': colwise, 'layers.*.o_proj': rowwise, ...} (module names or "
                f"globs; styles: {', '.join(STYLES)}), or use strategy=fsdp."]
    problems = []
    unknown = sorted({style for style in plan.values() if style not in STYLES})
    if unknown:
        problems.append(f"{source}: unknown tensor-parallel style {', '.join(map(repr, unknown))}; the styles are "
                        f"{', '.join(STYLES)}.")
    for pattern in plan:
        if not expand(model, {pattern: "x"}):
            problems.append(f"{source}: {pattern!r} matches no module of {type(model).__name__}.")
    for name, style in expand(model, plan).items():
        module = model.get_submodule(name)
        if style in LINEAR_STYLES:
            if not isinstance(module, nn.Linear):
                problems.append(f"{source}: {name} is a {type(module).__name__}; {style} splits nn.Linear layers only.")
                continue
            split = {"colwise": module.out_features, "rowwise": module.in_features,
                     "colwise_fused3": module.out_features // 3}[style]
            what = "input" if style == "rowwise" else "output"
            problems += indivisible(f"strategy.tensor_parallel_size={size_label}", size, split,
                                    f"{name}'s {split} {what} features", "choose a tensor-parallel size that divides them.")
        elif style in SEQUENCE_STYLES and not sequence_parallel:
            problems.append(f"{source}: {name}: {style} is a sequence-parallel style; set "
                            "strategy.sequence_parallel=true or leave it out of the plan.")
    for what, count in head_counts(model).items():
        problems += indivisible(f"strategy.tensor_parallel_size={size_label}", size, count,
                                f"{what}={count} (each rank computes whole heads)", "choose a size that divides it.")
    if sequence_parallel and not any(style == "split_sequence" for style in plan.values()):
        problems.append(f"strategy.sequence_parallel=true: {source} says nowhere where the sequence is split "
                        "(a split_sequence entry); the built-in GPT's plan has it. Set "
                        "strategy.sequence_parallel=false for this model.")
    return problems


def parallelize(model: nn.Module, mesh, plan: dict[str, str], sequence_parallel: bool) -> list[str]:
    """Split the planned modules of `model` (on any device, the meta device too) over the 1-D
    `mesh`; returns the module names split, in order."""
    from torch.distributed.tensor.parallel import parallelize_module

    styles = _styles(sequence_parallel)
    chosen = expand(model, plan)
    parallelize_module(model, mesh, {name: styles[style]() for name, style in chosen.items()})
    return list(chosen)


def _local(tensor):
    """A DTensor's local part; a plain tensor as it is. By isinstance: torch.compile answers
    hasattr(parameter, "to_local") with False for a DTensor parameter, and the product met the
    DTensor itself ("got mixed torch.Tensor and DTensor", found on an H100, trainer.compile=true)."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _fused_local_forward(module: nn.Linear, x):
    """A fused-column-parallel linear layer's forward: this rank's rows of the output (its q, k, v).
    The replicated input's gradient on each rank is only its heads' share: marked partial, so
    that the layer's input layout sums it over the tensor-parallel ranks in backward."""
    from torch.distributed.tensor import DTensor, Partial

    if isinstance(x, DTensor):
        x = x.to_local(grad_placements=[Partial()] * x.device_mesh.ndim)
    bias = _local(module.bias) if module.bias is not None else None
    return F.linear(x, _local(module.weight), bias)


def _styles(sequence_parallel: bool) -> dict[str, Callable]:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    between = Shard(1) if sequence_parallel else Replicate()  # the activations between the split layers

    class FusedColwiseParallel(ColwiseParallel):
        """ColwiseParallel for a layer whose output is three projections side by side: each third is
        split over the ranks (a strided shard), so a rank's output is its q, k and v, in that order.

        The product is taken on the local parts (the replicated input times this rank's rows), not
        through DTensor's sharding propagation: from torch 2.11 on, DTensor reads a lone strided
        shard as a shard order and refuses to propagate a linear layer over it ("placements:
        (_StridedShard(dim=0, sf=3),) is unable to be interpreted into a corresponding
        shard_order"). The numbers are the same; the gradients reach the parameters as DTensors
        of the same placement through to_local's backward."""

        def _partition_linear_fn(self, name, module, device_mesh):
            from torch.distributed.tensor import distribute_tensor
            from torch.distributed.tensor.placement_types import _StridedShard

            for pname, param in list(module.named_parameters(recurse=False)):
                fused = nn.Parameter(distribute_tensor(param, device_mesh, [_StridedShard(0, split_factor=3)],
                                                       src_data_rank=self.src_data_rank),
                                     requires_grad=param.requires_grad)
                module.register_parameter(pname, fused)
            module.forward = functools.partial(_fused_local_forward, module)

        @staticmethod
        def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
            # the output's thirds stay split as the weight's are (a contiguous Shard(-1) would
            # mix q and k on one rank): this rank's q, k and v, side by side, as a plain tensor
            return outputs

    return {
        "colwise": lambda: ColwiseParallel(input_layouts=between),
        "colwise_fused3": lambda: FusedColwiseParallel(input_layouts=between),
        "rowwise": lambda: RowwiseParallel(output_layouts=between),
        # plain tensors between modules (a residual adds a layer's output to its input)
        "sequence_parallel": lambda: SequenceParallel(use_local_output=True),
        "split_sequence": lambda: PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                                     use_local_output=True),
        "gather_sequence": lambda: PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                                      use_local_output=True),
    }
