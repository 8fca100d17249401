"""The built-in dimensions' resolve steps (framework/strategy/mesh/dims.py lists them in DIMENSIONS,
the order they take their ranks in): each takes its share of the ranks the ones before it left,
reading the settings (`given`: a DimsSettings) and refusing an indivisible size in framework/errors.py's one form."""
from __future__ import annotations

import math
from typing import Any

from framework.errors import ConfigError, indivisible, refuse
from framework.strategy.mesh.dimension import Taking, ranks_phrase


def _context(given: Any, taking: Taking) -> None:
    """Context ranks first: they split every sequence of a group's batch, whatever else the group does."""
    taking.take_first("context", "strategy.context_parallel_size", given.context)


def _tensor(given: Any, taking: Taking) -> None:
    """'auto': the devices of one node that the ranks over pipeline and data allow, so the layers'
    frequent collectives stay on the fast link (1 when the pipeline itself is 'auto', every rank a
    stage, or when experts take the ranks)."""
    ranks, size = taking.ranks, given.tensor
    if size == "auto" and (given.expert > 1 or given.pipeline == "auto"):
        size = 1
    elif size == "auto" and given.data_parallel != "auto":
        size = ranks // max(int(given.pipeline) * int(given.data_parallel), 1)
    elif size == "auto":
        size = math.gcd(taking.devices, ranks // max(int(given.pipeline), 1)) or 1
    taking.take("tensor", int(size))
    label = f"auto ({size})" if given.tensor == "auto" else str(size)
    refuse(indivisible(f"strategy.tensor_parallel_size={label}", int(size), ranks, ranks_phrase(ranks),
                       "choose a size that divides them."))


def _pipeline(given: Any, taking: Taking) -> None:
    """'auto': the ranks tensor and data parallelism leave."""
    ranks, tp = taking.ranks, taking.sizes["tensor"]
    dp = 1 if given.data_parallel == "auto" else int(given.data_parallel)
    pp = ranks // max(tp * dp, 1) if given.pipeline == "auto" else int(given.pipeline)
    taking.take("pipeline", pp)
    label = f"auto ({tp})" if given.tensor == "auto" else str(tp)
    refuse(indivisible(f"strategy.pipeline_parallel_size={given.pipeline}"
                       + (f" x strategy.tensor_parallel_size={label}" if tp > 1 else ""), pp * tp, ranks,
                       ranks_phrase(ranks), "choose a size that divides them (the rest become data-parallel groups)."))


def _data(given: Any, taking: Taking) -> None:
    """'auto': the rest; a given size must make the product the ranks."""
    ranks, pp, tp = taking.ranks, taking.sizes["pipeline"], taking.sizes["tensor"]
    if given.data_parallel != "auto" and pp * int(given.data_parallel) * tp != ranks:
        label = f"auto ({tp})" if given.tensor == "auto" else str(tp)
        raise ConfigError((f"strategy.pipeline_parallel_size={given.pipeline} x " if given.pipeline != 1 else "")
                          + f"strategy.data_parallel_size={given.data_parallel} x strategy.tensor_parallel_size={label} "
                          f"is {pp * int(given.data_parallel) * tp} ranks, but the run has {ranks} (devices x "
                          "num_nodes); make their product the number of ranks, or set one of them to 'auto'.")
    taking.take("data", ranks // (pp * tp))


def _shard(given: Any, taking: Taking) -> None:
    """The data-parallel ranks as replicas of sharded groups (hsdp: strategy.shard_size ranks of one
    node each), or all one sharded group."""
    dp, devices = taking.sizes.pop("data"), taking.devices
    if given.shard is None:
        taking.take("shard", dp)
        return
    shard = devices if given.shard == "auto" else int(given.shard)
    key = f"strategy.shard_size={f'auto ({shard})' if given.shard == 'auto' else shard}"
    fix = "a shard group must not span two nodes. Choose a size that divides devices, or shard_size=auto (one node)."
    refuse(indivisible(key, shard, devices, f"the {devices} ranks of a node (devices)", fix)
           or indivisible(key, shard, dp, f"the {dp} data-parallel ranks", fix))
    taking.take("replicate", dp // shard)
    taking.take("shard", shard)


def _expert(given: Any, taking: Taking) -> None:
    """Expert ranks borrowed from the shard dimension, which they must divide."""
    shard = taking.sizes["shard"]
    refuse(indivisible(f"strategy.expert_parallel_size={given.expert}", given.expert, shard,
                       f"the {shard} ranks that shard the model (the data-parallel ranks, or strategy.shard_size "
                       "under hsdp)", "choose a size that divides them."))
    taking.take("expert", given.expert)
