"""`framework plan [OVERRIDES...]`: what a run would be, without running it.

Composes the config exactly as train.py does, validates it, and prints the five resolved
plugins, the world (ranks per node), the model's size (built on the meta device), the estimated
bytes per rank for its states under the chosen strategy next to the device's memory, and any
compatibility refusal. No process group, no device memory, no deepspeed import.
"""
from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from framework.errors import ConfigError, UserError, report


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def optimizer_states(cfg: DictConfig) -> int:
    """State tensors per parameter for the configured optimizer (Adam-family 2, SGD 0 or 1)."""
    target = str(cfg.optimizer.get("_target_", ""))
    if "SGD" in target:
        return 1 if cfg.optimizer.get("momentum", 0) else 0
    return 2  # Adam, AdamW, and a safe upper bound for the rest


def model_stats(cfg: DictConfig, plugins):
    import torch

    from framework.config.build import build
    from framework.config.meta_build import meta_device
    from framework.strategy.memory import ModelStats

    with meta_device():
        model = build(cfg.model, "model")
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    units = getattr(plugins.strategy, "wrap_modules", None) or list(getattr(model, "sharding_units", ()))
    if units:
        sizes = [sum(p.numel() for p in m.parameters()) for m in model.modules() if type(m).__name__ in units]
    else:
        sizes = [sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()]
    precision = plugins.precision
    param_bytes = torch.empty((), dtype=precision.param_dtype).element_size()
    mixed_half = precision.param_dtype == torch.float32 and precision.compute_dtype in (torch.float16, torch.bfloat16)
    stats = ModelStats(params, max(sizes or [params]), param_bytes, mixed_half, optimizer_states(cfg))
    return model, stats, units


def ranks_per_node(devices: int, num_nodes: int) -> str:
    shown = []
    for node in range(min(num_nodes, 4)):
        first = node * devices
        ranks = f"{first}" if devices == 1 else f"{first}-{first + devices - 1}"
        shown.append(f"node {node}: ranks {ranks}")
    if num_nodes > 4:
        shown.append(f"... node {num_nodes - 1}: ranks {(num_nodes - 1) * devices}-{num_nodes * devices - 1}")
    return "; ".join(shown)


def plan(cfg: DictConfig, out=None) -> int:
    from framework.config.compatibility import check_compatibility
    from framework.config.targets import check_targets
    from framework.config.validate import check_values
    from framework.plugins import build_plugins
    from framework.runner import compatibility_plan

    out = out or sys.stdout
    resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    check_values(resolved)
    check_targets(resolved)
    plugins = build_plugins(resolved)
    devices = plugins.accelerator.resolve_devices(resolved.devices)
    world = devices * resolved.num_nodes
    print("plugins", file=out)
    groups = ("accelerator", "strategy", "precision", "checkpoint_io", "cluster")
    width = max(len(str(getattr(getattr(plugins, g), "name", "?"))) for g in groups) + 2
    for group in groups:
        plugin = getattr(plugins, group)
        name = str(getattr(plugin, "name", "?"))
        print(f"  {group:<15}{name:<{width}}{type(plugin).__module__}.{type(plugin).__name__}", file=out)
    print("world", file=out)
    print(f"  {world} process(es) = devices {devices} x num_nodes {resolved.num_nodes}; "
          f"{ranks_per_node(devices, resolved.num_nodes)}", file=out)
    model, stats, units = model_stats(resolved, plugins)
    print("model", file=out)
    unit = f"largest unit gathered at once ({'/'.join(units) if units else 'largest layer'}): {stats.largest_unit:,}"
    print(f"  {type(model).__name__}: {stats.params:,} trainable parameters; {unit}", file=out)
    estimate = plugins.strategy.estimate_memory(stats, world)
    print("memory per rank (weights, gradients, optimizer state; activations not counted)", file=out)
    line = f"  {plugins.strategy.name}: {estimate.formula} = {human_bytes(estimate.device)} on {plugins.accelerator.name}"
    if estimate.host:
        line += f", {human_bytes(estimate.host)} offloaded to CPU memory"
    print(line, file=out)
    memory = plugins.accelerator.memory_bytes() if plugins.accelerator.is_available() else None
    if memory:
        if plugins.accelerator.name == "cpu":
            need = (estimate.device + estimate.host) * devices
            print(f"  this node: {devices} process(es) x {human_bytes(estimate.device + estimate.host)} = "
                  f"{human_bytes(need)} of {human_bytes(memory)} RAM ({100 * need / memory:.2f}%)", file=out)
        else:
            print(f"  device memory: {human_bytes(memory)} ({100 * estimate.device / memory:.2f}% for model states)",
                  file=out)
    warnings = io.StringIO()
    try:
        with contextlib.redirect_stderr(warnings):
            check_compatibility(compatibility_plan(plugins, resolved, devices))
    except ConfigError as err:
        print("compatibility: refused", file=out)
        for problem in str(err).splitlines():
            print(f"  - {problem}", file=out)
        return 2
    notes = [w.removeprefix("WARNING: ") for w in warnings.getvalue().splitlines() if w.strip()]
    print("compatibility: ok" + "".join(f"\n  warning: {w}" for w in notes), file=out)
    return 0


def main(args: list[str]) -> int:
    from framework.config.compose import compose
    from framework.paths import conf_dir, find_recipe

    recipe = None
    if args[:1] in (["--recipe"], ["-r"]):
        if len(args) < 2:
            print("usage: framework plan [--recipe RECIPE] [OVERRIDES...]", file=sys.stderr)
            return 2
        recipe, args = args[1], args[2:]
    try:
        if recipe:
            path = find_recipe(recipe)
            cfg = compose(path.parent, path.stem, args)
        else:
            cfg = compose(Path(conf_dir()), "train", args)
        return plan(cfg)
    except UserError as err:
        report(err)
        return 2
