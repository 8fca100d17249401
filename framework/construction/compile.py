"""`trainer.compile=true`: torch.compile the model whole (one graph, as `torch.compile(model)`
does), or each of its units (framework/construction/units.py: the transformer blocks) where the
strategy wraps units: a sharding strategy's hooks gather and free each unit's weights around it,
and activation checkpointing recomputes each unit, so there the hooks stay between compiled units,
as torchtitan compiles its blocks before sharding them. Compiled in place (`Module.compile`), so
module and parameter names, and so checkpoints, are unchanged.

Why whole where possible: compiling the blocks alone leaves the embeddings, the final norm, the
head and the operations between blocks eager. Measured with torch.profiler on the CPU (a 2 x 64
GPT, batch 8 x 64, one training step of forward, backward and AdamW): 1572 aten operations eager,
1134 with `torch.compile(model)`, 1210 with the blocks compiled (benchmarks/compile.py). The
built-in GPT's blocks compile to one graph each, no graph break, and share one compiled graph
(no recompilation per block).

Compilation happens at the first forward (and again for a new input shape); the loop says how long
the first step took, so a slow first step is not mistaken for a slow run.
"""
from __future__ import annotations

from typing import Callable

from torch import nn

from framework.construction.units import Units


def compile_model(model: nn.Module, units: Callable[[nn.Module], Units] | None, talk: bool) -> str:
    """Compile `model` in place: whole when `units` is None, else each of its units (the whole model
    where it has none); returns what was compiled, as the user reads it."""
    chosen = units(model) if units is not None else None
    if chosen is not None and chosen.modules:
        for module in chosen.modules:
            module.compile()
        what = f"{chosen.listed()}, one by one (the strategy's hooks sit between them)"
    else:
        model.compile()
        what = f"the whole {type(model).__name__}" + (" (it has no units)" if chosen is not None else "")
    if talk:
        print(f"compile: torch.compile on {what}; compiled at the first forward", flush=True)
    return what


def untraceable(module: nn.Module, args: tuple, kwargs: dict) -> str | None:
    """Why torch.compile cannot capture `module`'s forward as one graph, traced on these (meta)
    inputs without running anything (dynamo's reason and the line of the model's code), or None
    when it can, or when the tracing could not decide on meta tensors. Where it cannot, compile
    splits the forward and runs the parts between graphs eagerly: little or no speed-up."""
    import torch._dynamo

    try:
        torch.compile(module, fullgraph=True, backend="eager")(*args, **kwargs)
    except torch._dynamo.exc.Unsupported as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        where = next((line for line in lines if line.startswith("# File ")), "")
        explanation = next((line.removeprefix("Explanation:").strip() for line in lines
                            if line.startswith("Explanation:")), "")
        return "; ".join(part.rstrip(".") for part in (lines[0], explanation, where.removeprefix("# ")) if part)
    except Exception:  # an op without a meta kernel, a shape only real data has: no verdict
        return None
    finally:
        torch._dynamo.reset()
    return None
