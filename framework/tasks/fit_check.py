"""Before launch: one training step's forward through model and task on the meta device (shapes
and dtypes only: no memory, no compute). It refuses a model, data and task that do not fit
together, naming the three and the shapes, instead of a torch traceback at the first step; and it
measures the activations the step keeps for backward (what `framework plan` adds to the states).
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping

import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves, tree_map

from framework.construction.compile import untraceable
from framework.construction.meta_build import meta_device
from framework.errors import ConfigError


class _FusedAttention(torch.autograd.Function):
    """On the meta device, what a fused attention kernel keeps for backward: flash and
    memory-efficient attention (CUDA; the CPU's flash kernel) save the queries, keys, values, the
    output and one float32 log-sum-exp per query and head, never the T x T attention matrix that
    the meta device's decomposition would (at a 4096 context that matrix is 16M numbers per head)."""

    @staticmethod
    def forward(ctx, query, key, value, mask):
        out = query.new_empty(*query.shape[:-1], value.shape[-1])
        logsumexp = query.new_empty(query.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(query, key, value, out, logsumexp, *([mask] if mask is not None else []))
        return out

    @staticmethod
    def backward(ctx, grad):
        query, key, value = ctx.saved_tensors[:3]
        return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value), None


class _AsDeviceAttention(TorchFunctionMode):
    """F.scaled_dot_product_attention measured as `device_type`'s kernels run it. CUDA: fused
    always (flash attention, or memory-efficient attention where a mask is given; both draw the
    dropout mask inside the kernel). The CPU: its flash kernel without a mask and without dropout,
    else the math path, which keeps the T x T attention weights (measured on this project's CPU at
    context 2048, batch 32, the default GPT: process peak 1.67 GB without dropout, 15.9 GB with
    model.dropout=0.1). Elsewhere: the math path (an upper bound)."""

    def __init__(self, device_type: str):
        super().__init__()
        self.device_type = device_type

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            query, key, value = args[:3]
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            dropout = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
            if self.device_type == "cuda" or (self.device_type == "cpu" and mask is None and not dropout):
                return _FusedAttention.apply(query, key, value, mask)
        return func(*args, **kwargs)


def _shapes(batch) -> str:
    leaves = [f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in tree_leaves(batch)
              if isinstance(t, torch.Tensor)]
    return ", ".join(leaves) or "no tensors"


# Module names of learned position tables: a longer sequence would index past their end, which the
# meta device cannot see (it has no index bounds), so their size is compared with the batch.
POSITION_TABLES = ("wpe", "pos_emb", "position_embeddings", "embed_positions")
CONTEXT_KEYS = ("n_positions", "max_position_embeddings", "n_ctx")


def _sequence_length(batch) -> int | None:
    """Tokens per row of the batch's first integer tensor of two or more dimensions (its inputs)."""
    for t in tree_leaves(batch):
        if isinstance(t, torch.Tensor) and t.dim() >= 2 and not t.is_floating_point():
            return int(t.shape[-1])
    return None


def _context_key(model, positions: int) -> str:
    """The config key that sets the model's context, for the message."""
    config = getattr(model, "config", None)
    for key in CONTEXT_KEYS:
        if getattr(config, key, None) == positions:
            return f"model.config.{key}"
    return "model.block_size" if getattr(model, "block_size", None) == positions else "the model's context"


def check_context(model, batch) -> None:
    """Refuse blocks longer than the model's learned position table (GPT-2's n_positions below
    data.block_size would fail at the first step with an IndexError)."""
    length = _sequence_length(batch)
    if length is None:
        return
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Embedding) and name.rsplit(".", 1)[-1] in POSITION_TABLES \
                and module.num_embeddings < length:
            key = _context_key(model, module.num_embeddings)
            raise ConfigError(
                f"data.block_size={length}: the data's blocks are {length} tokens, but the model "
                f"({type(model).__name__}) has learned positions for {module.num_embeddings} ({key}={module.num_embeddings}, "
                f"its {name}). Set data.block_size={module.num_embeddings} or less, or {key}={length} (a "
                "pretrained model's positions cannot grow).")


def takes(function, name: str) -> bool:
    """Whether `function` accepts the keyword argument `name` (by name, or through **kwargs)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return True  # no signature to read: no verdict
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in parameters)


def check_packing(model, batch) -> None:
    """Packed rows (several samples in one row, kept apart by position_ids) need a model that takes
    position_ids: one that does not would let the samples attend to each other, or fail."""
    if isinstance(batch, Mapping) and "position_ids" in batch and not takes(model.forward, "position_ids"):
        raise ConfigError(f"data.packing=true: the data packs several samples into each row and keeps them apart "
                          f"by position_ids, but the model ({type(model).__name__}) takes no position_ids. Set "
                          "data.packing=false (each sample a row of its own, padded per batch).")


def meta_example_batch(data, size: int, task=None):
    """The data's example batch as meta tensors: made on the meta device, so a batch of any shape
    (a context of 10^8 tokens) costs no memory; an example_batch that reads values is made for
    real and moved. With a `task` that trains on batches it rolls out of the data's (online
    learning: task.rollout), what it trains on: its `rolled_example` of that batch."""
    try:
        with torch.device("meta"):
            batch = data.example_batch(size)
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        batch = data.example_batch(size)
    batch = tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, batch)
    if task is not None and getattr(task, "rollout", None) is not None:
        with torch.device("meta"):
            batch = task.rolled_example(batch)
    return batch


def validation_metric_names(model, data, task) -> set[str] | None:
    """The metric names a validation logs (val/<name>), from the task's own validation step run on
    an example batch on the meta device and its compute_metrics on stand-in totals; None when that
    cannot be told here (an op without a meta kernel, a step that reads values)."""
    batch = meta_example_batch(data, 2)
    try:
        with meta_device(), torch.no_grad():
            sums = task.validation_step(model, batch)
        totals = {key: torch.ones((), dtype=torch.float64) for key in sums}
        return {f"val/{name}" for name in task.compute_metrics(totals)}
    except Exception:  # no verdict: the run itself will say what a validation logs
        return None


def check_fit(model, data, task, batch_size: int = 2, device_type: str = "cpu") -> int:
    """Raise a ConfigError when one step's forward fails on the shapes; return the bytes of the
    tensors autograd saves for backward on a batch of `batch_size` (parameters excluded; each
    storage once; attention as `device_type`'s kernels keep it), or 0 where nothing was measured. A
    task that steps its optimizers itself is not run (its step needs the optimizers); errors of ops
    without a meta kernel are not the user's."""
    if not getattr(task, "automatic_optimization", True):
        try:  # its step needs the optimizers; what they are built over is asked of the model now
            task.optimizer_groups(model)
        except (AttributeError, KeyError, TypeError) as err:
            raise _misfit(model, data, task, f"the task's optimizer_groups (it steps its optimizers itself) fails "
                                             f"with: {err}") from err
        return 0
    batch = meta_example_batch(data, batch_size, task)
    check_context(model, batch)
    check_packing(model, batch)
    meta_batch = tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, batch)
    params = {p.untyped_storage()._cdata for p in model.parameters() if p.is_meta}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor):
        if t.is_meta and t.untyped_storage()._cdata not in params:
            saved[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
        return t

    try:
        with meta_device(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                _AsDeviceAttention(device_type):
            task.training_step(model, meta_batch)
    except NotImplementedError:
        return 0
    except (RuntimeError, ValueError, TypeError, IndexError, AttributeError, KeyError) as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "meta" in message:  # e.g. .item() or an op with no meta kernel: no verdict on the shapes
            return 0
        raise _misfit(model, data, task, f"one training step on an example batch ({_shapes(batch)}) fails with: "
                                         f"{message}") from err
    return sum(saved.values())


def _misfit(model, data, task, failure: str) -> ConfigError:
    names = {group: type(obj).__name__ for group, obj in (("model", model), ("data", data), ("task", task))}
    return ConfigError(
        f"model ({names['model']}), data ({names['data']}) and task ({names['task']}) do not fit together: "
        f"{failure}. Choose options of the three groups that match (e.g. model=mlp data=digits "
        "task=classification, model=gan data=gaussian_ring task=gan, or the default GPT with data=stdlib_text "
        "task=language_modeling).")


def forward_call(module, model, data, task, batch_size: int = 2) -> tuple[tuple, dict] | None:
    """The (args, kwargs) `module` (the model or one of its units) is first called with in one
    training step on an example batch, as meta tensors (nothing computed); None where the step
    cannot run on meta or does not call it."""
    if not getattr(task, "automatic_optimization", True):
        return None
    batch = meta_example_batch(data, batch_size, task)
    calls: list = []

    def grab(_, args, kwargs):
        if not calls:
            calls.append((args, dict(kwargs)))

    handle = module.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with meta_device():
            task.training_step(model, batch)
    except (NotImplementedError, RuntimeError, ValueError, TypeError, IndexError):
        pass  # check_fit says what is wrong with the shapes; here only the call matters
    finally:
        handle.remove()
    return calls[0] if calls else None


def check_compilable(model, data, task, strategy, activation_checkpointing: bool) -> None:
    """trainer.compile=true: what will be compiled (the model whole, or its first unit where the
    strategy compiles units: framework/construction/compile.py) must trace as one graph; where it
    cannot, compiling would run it in pieces, eagerly between them, for little or no speed-up."""
    units = strategy.units(model).modules if strategy.shards_states or activation_checkpointing else []
    target = units[0] if units else model
    call = forward_call(target, model, data, task)
    reason = untraceable(target, *call) if call is not None else None
    if reason:
        what = f"{type(target).__name__} (the model's unit)" if units else type(model).__name__
        raise ConfigError(f"trainer.compile=true: torch.compile cannot capture {what}'s forward as one graph: {reason}. "
                          "Compiled, it would run in pieces with eager code between them, for little or no speed-up. "
                          "Make that code traceable (no Python branch on a tensor's value, no .item() or print in "
                          "the forward), or set trainer.compile=false.")
