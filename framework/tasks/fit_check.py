"""Before launch: one training step's forward through model and task on the meta device (shapes
and dtypes only: no memory, no compute). It refuses a model, data and task that do not fit
together, naming the three and the shapes, instead of a torch traceback at the first step; and it
measures the activations the step keeps for backward (what `framework plan` adds to the states).
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_leaves, tree_map

from framework.construction.meta_build import meta_device
from framework.errors import ConfigError


def _shapes(batch) -> str:
    leaves = [f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in tree_leaves(batch)
              if isinstance(t, torch.Tensor)]
    return ", ".join(leaves) or "no tensors"


def check_fit(model, data, task, batch_size: int = 2) -> int:
    """Raise a ConfigError when one step's forward fails on the shapes; return the bytes of the
    tensors autograd saves for backward on a batch of `batch_size` (parameters excluded; each
    storage once), or 0 where nothing was measured. A task that steps its optimizers itself is
    not run (its step needs the optimizers); errors of ops without a meta kernel are not the user's."""
    if not getattr(task, "automatic_optimization", True):
        return 0
    batch = data.example_batch(batch_size)
    meta_batch = tree_map(lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t, batch)
    params = {p.untyped_storage()._cdata for p in model.parameters() if p.is_meta}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor):
        if t.is_meta and t.untyped_storage()._cdata not in params:
            saved[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
        return t

    try:
        with meta_device(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            task.training_step(model, meta_batch)
    except NotImplementedError:
        return 0
    except (RuntimeError, ValueError, TypeError, IndexError) as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "meta" in message:  # e.g. .item() or an op with no meta kernel: no verdict on the shapes
            return 0
        names = {group: type(obj).__name__ for group, obj in (("model", model), ("data", data), ("task", task))}
        raise ConfigError(
            f"model ({names['model']}), data ({names['data']}) and task ({names['task']}) do not fit together: "
            f"one training step on an example batch ({_shapes(batch)}) fails with: {message}. Choose options "
            "of the three groups that match (e.g. model=mlp data=digits task=classification, or the default "
            "GPT with data=stdlib_text task=language_modeling).") from err
    return sum(saved.values())
