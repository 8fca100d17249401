"""The FSDP2 applier: a model's units, then its root, sharded over the mesh's data-parallel
dimensions (shard; replicate x shard: hybrid), and a model built on the meta device materialised
shard by shard with the initialisation an ordinary build makes (framework/construction/meta_init.py;
a pipeline rank's stages: framework/strategy/mesh/pipeline/run.py)."""
from __future__ import annotations

import torch

from framework.construction.meta_init import InitLog, replay
from framework.construction.units import Units
from framework.tensors import write_part


def shard_kwargs(mesh, precision, reshard_after_forward: bool, cpu_offload: bool, device: torch.device,
                 ignored: set | None = None) -> dict:
    """fully_shard's arguments: the mesh, when to free gathered parameters, where shards live, the
    precision plugin's compute dtype as FSDP's MixedPrecisionPolicy (gathered in that dtype,
    gradients reduced in float32), and the parameters it leaves alone (spread experts)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward,
              "offload_policy": (CPUOffloadPolicy(pin_memory=device.type == "cuda")  # pinning needs a GPU
                                 if cpu_offload else OffloadPolicy())}
    if ignored:
        kwargs["ignored_params"] = set(ignored)
    dtypes = precision.sharded_param_dtypes()
    if dtypes is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtypes[0], reduce_dtype=dtypes[1])
    return kwargs


def apply_fully_shard(roots: list[torch.nn.Module], units: Units, kwargs: dict) -> None:
    """Each unit inside each root sharded as one, then the root (a pipeline rank's stages are roots
    of their own: the schedule calls the stages, not the rank's part)."""
    from torch.distributed.fsdp import fully_shard

    for root in roots:
        for unit in units.modules:
            if len(roots) == 1 or any(unit is m for m in root.modules()):
                fully_shard(unit, **kwargs)
        fully_shard(root, **kwargs)


def materialise(model: torch.nn.Module, log: InitLog, device: torch.device) -> None:
    """Allocate this rank's shards and fill them with the recorded initialisation."""
    model.to_empty(device=device)

    def write(name: str, full: torch.Tensor) -> None:
        owner, _, leaf = name.rpartition(".")
        target = getattr(model.get_submodule(owner), leaf)
        write_part(full.to(target.dtype), target)

    replay(log, write)
