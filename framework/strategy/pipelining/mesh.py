"""The sizes of the pipeline's (pipeline, data_parallel, tensor_parallel) mesh, 'auto' resolved."""
from __future__ import annotations

import math

from framework.errors import ConfigError


def mesh_sizes(world_size: int, devices: int, pipeline, data_parallel, tensor_parallel) -> tuple[int, int, int]:
    """(pipeline, data-parallel, tensor-parallel sizes) of `world_size` ranks from the three settings
    (an int or 'auto'). Tensor parallel 'auto': the devices of one node that the ranks over the
    other two allow (1 when the pipeline itself is 'auto', every rank a stage); pipeline 'auto':
    the ranks the other two leave; data parallel 'auto': what remains."""
    if tensor_parallel != "auto":
        tp = int(tensor_parallel)
    elif pipeline == "auto":
        tp = 1
    elif data_parallel != "auto":
        tp = world_size // max(int(pipeline) * int(data_parallel), 1)
    else:  # within a node, so the layers' frequent collectives stay on the fast link
        tp = math.gcd(devices, world_size // max(int(pipeline), 1)) or 1
    dp = None if data_parallel == "auto" else int(data_parallel)
    pp = world_size // (tp * (dp or 1)) if pipeline == "auto" else int(pipeline)
    tp_label = f"auto ({tp})" if tensor_parallel == "auto" else str(tp)
    if tp < 1 or world_size % tp:
        raise ConfigError(f"strategy.tensor_parallel_size={tp_label} does not divide the {world_size} ranks (devices "
                          "x num_nodes); choose a size that divides them.")
    if pp < 1 or world_size % (pp * tp):
        raise ConfigError(f"strategy.pipeline_parallel_size={pipeline}"
                          + (f" x strategy.tensor_parallel_size={tp_label}" if tp > 1 else "")
                          + f" does not divide the {world_size} ranks (devices x num_nodes); choose a size that "
                          "divides them (the rest become data-parallel groups).")
    if dp is not None and pp * dp * tp != world_size:
        raise ConfigError(f"strategy.pipeline_parallel_size={pipeline} x strategy.data_parallel_size={dp} x "
                          f"strategy.tensor_parallel_size={tp_label} is {pp * dp * tp} ranks, but the run has "
                          f"{world_size} (devices x num_nodes); make their product the number of ranks, or set one "
                          "of them to 'auto'.")
    return pp, world_size // (pp * tp), tp
