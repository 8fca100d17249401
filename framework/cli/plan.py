"""`framework plan [OVERRIDES...]`: what a run would be, without running it.

Composes the config exactly as train.py does, validates it, and prints the five resolved
plugins, the world (ranks per node), the model's size (built on the meta device), the estimated
bytes per rank for its states under the chosen strategy next to the device's memory, and any
compatibility refusal. No process group, no device memory, no deepspeed import.

`--device cuda --device-memory 80GiB` plans for a machine this one is not (a login node planning
for its GPU nodes): the accelerator is taken as present there, with that much memory per device.
"""
from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig

from framework.adapter.lora import count_parameters
from framework.cli.options import split_options
from framework.config.build import build
from framework.config.compose import compose
from framework.config.groups import PLUGIN_GROUPS
from framework.config.plan_facts import processes_per_node
from framework.config.targets import import_target
from framework.console import human_bytes, parse_size
from framework.errors import ConfigError, ExitCode, UserError, report
from framework.models.moe_stats import describe_experts
from framework.paths import conf_dir, find_recipe
from framework.planning.memory import estimate, model_stats
from framework.preflight import prepare


def ranks_per_node(devices: int, num_nodes: int) -> str:
    shown = []
    for node in range(min(num_nodes, 4)):
        first = node * devices
        ranks = f"{first}" if devices == 1 else f"{first}-{first + devices - 1}"
        shown.append(f"node {node}: ranks {ranks}")
    if num_nodes > 4:
        shown.append(f"... node {num_nodes - 1}: ranks {(num_nodes - 1) * devices}-{num_nodes * devices - 1}")
    return "; ".join(shown)


def plan(cfg: DictConfig, out=None, device_memory: int | None = None, elsewhere: bool = False) -> int:
    out = out or sys.stdout
    prepared = prepare(cfg, strict=False, device_memory=device_memory, elsewhere=elsewhere)
    if any(problem not in prepared.refusals for problem in prepared.problems):
        prepared.raise_problems()  # a plan is shown for a refused combination only, not for a broken config
    resolved, plugins, devices, model = prepared.resolved, prepared.plugins, prepared.devices, prepared.model
    per_node = processes_per_node(plugins.strategy, devices)
    world = per_node * resolved.num_nodes
    if elsewhere:
        memory = f" of {human_bytes(device_memory)}" if device_memory else " (memory not given: --device-memory 80GiB)"
        print(f"planned for another machine: {plugins.accelerator.name} devices{memory}, taken as present, with bf16 "
              "and fused attention kernels", file=out)
    print("plugins", file=out)
    width = max(len(str(getattr(getattr(plugins, g), "name", "?"))) for g in PLUGIN_GROUPS) + 2
    for group in PLUGIN_GROUPS:
        plugin = getattr(plugins, group)
        name = str(getattr(plugin, "name", "?"))
        print(f"  {group:<17}{name:<{width}}{type(plugin).__module__}.{type(plugin).__name__}", file=out)
    print("world", file=out)
    if plugins.strategy.spmd:
        print(f"  {world} process(es), one per node, each driving {devices} device(s) (SPMD); "
              f"{ranks_per_node(1, resolved.num_nodes)}", file=out)
    else:
        print(f"  {world} process(es) = devices {devices} x num_nodes {resolved.num_nodes}; "
              f"{ranks_per_node(devices, resolved.num_nodes)}", file=out)
    for line in plugins.strategy.layout(world, model).lines if not prepared.refusals else ():
        print(f"  {line}", file=out)
    stats, units = model_stats(resolved, plugins, model, prepared.second_model[1])
    print("model", file=out)
    print(f"  {type(model).__name__}: {stats.params:,} trainable parameters; largest unit gathered at once: "
          f"{stats.largest_unit:,}", file=out)
    print(f"  units: {units.describe()}", file=out)
    experts = describe_experts(model)
    if experts:
        print(f"  {experts}", file=out)
    if resolved.get("adapter"):
        trainable, frozen = count_parameters(model)
        print(f"  adapter={resolved.adapter._target_.rsplit('.', 1)[-1].lower()}: {trainable:,} trainable parameters "
              f"({100 * trainable / max(trainable + frozen, 1):.2f}% of {trainable + frozen:,}), {frozen:,} frozen "
              f"({human_bytes(stats.frozen_bytes)}"
              f"{', quantized layers included' if plugins.precision.frozen_weights(model)[0] else ''})",
              file=out)
    key, second = prepared.second_model
    if second:
        print(f"  {key}: a frozen second model of {second:,} parameters ({human_bytes(second * stats.param_bytes)}), "
              "its weights alone (no gradients, no optimizer state), placed as the trained model's are", file=out)
    frozen_params, frozen_bytes = plugins.precision.frozen_weights(model)
    if frozen_params:
        quantized, kept = plugins.precision.plan_layers(model)
        print(f"  precision={plugins.precision.name}: {len(quantized)} linear layers quantized, {frozen_params:,} "
              f"weights frozen in {human_bytes(frozen_bytes)}" + (f"; kept: {', '.join(kept)}" if kept else ""),
              file=out)
    states = estimate(plugins.strategy, stats, world)
    print("memory per rank: model states (weights, gradients, optimizer state) and activations", file=out)
    line = f"  {plugins.strategy.name}: {states.formula} = {human_bytes(states.device)} on {plugins.accelerator.name}"
    if states.disk:
        line += (f", {human_bytes(states.host)} in CPU memory (the float32 gradient partition and DeepSpeed's swap "
                 f"buffers), {human_bytes(states.disk)} swapped to {plugins.strategy.nvme_path}")
    elif states.host:
        line += f", {human_bytes(states.host)} offloaded to CPU memory"
    print(line, file=out)
    activations = prepared.activation_bytes
    if activations:
        batch = resolved.data.get("batch_size")
        note = (", units checkpointed (their inputs, and one unit recomputed in backward)"
                if resolved.trainer.activation_checkpointing else "")
        kernels = {"cuda": "CUDA's fused attention (no T x T matrix)",
                   "cpu": "the CPU's attention (fused without mask and dropout, else T x T)"}.get(
            plugins.accelerator.name, "attention's T x T matrices (an upper bound)")
        print(f"  activations: {human_bytes(activations)} for one micro-batch of {batch}, measured on the meta device"
              f" in the model's dtype, {kernels}{note}", file=out)
    rollout = _rollout_memory(resolved, model, stats.param_bytes)
    if rollout is not None:
        print(f"  task.rollout: {human_bytes(rollout[0])} while sampling, before the step's forwards: {rollout[1]}",
              file=out)
        activations = max(activations, rollout[0])
    print(f"  total per rank: {human_bytes(states.device + activations)} on {plugins.accelerator.name}", file=out)
    memory = plugins.accelerator.memory_bytes() if plugins.accelerator.is_available() else None
    if memory:
        if plugins.accelerator.name == "cpu":
            need = (states.device + states.host + activations) * devices
            print(f"  this node: {devices} process(es) x {human_bytes(states.device + states.host + activations)} = "
                  f"{human_bytes(need)} of {human_bytes(memory)} RAM ({100 * need / memory:.2f}%)", file=out)
        else:
            print(f"  device memory: {human_bytes(memory)} ({100 * states.device / memory:.2f}% for model states)",
                  file=out)
    if prepared.refusals:
        print("compatibility: refused", file=out)
        for problem in prepared.refusals:
            print(f"  - {problem}", file=out)
        return ExitCode.USER_ERROR
    print("compatibility: ok" + "".join(f"\n  warning: {w}" for w in prepared.warnings), file=out)
    return ExitCode.OK


def _rollout_memory(resolved, model, element_bytes: int) -> tuple[int, str] | None:
    """A task that samples its batches in the loop (task=grpo): what a rank holds while it samples."""
    if getattr(import_target(resolved.task._target_, "task"), "rollout", None) is None:
        return None
    task = build(resolved.task, "task")
    prompts = int(resolved.data.get("batch_size", 1) or 1)
    return task.rollout_memory(model, int(resolved.data.get("max_prompt_tokens", 0) or 0), prompts, element_bytes)


USAGE = "usage: framework plan [--recipe RECIPE] [--device TYPE] [--device-memory SIZE] [OVERRIDES...]"
OPTIONS = ("--recipe", "-r", "--device", "--device-memory")


def main(args: list[str]) -> int:
    try:
        options, overrides = split_options(args, OPTIONS, "framework plan", USAGE)
        memory = None
        if "--device-memory" in options:
            memory = parse_size(options["--device-memory"])
            if memory is None:
                raise ConfigError(f"framework plan --device-memory={options['--device-memory']!r}: not a size; give one "
                                  "such as 80GiB, 40GB or 81920MiB (the memory of one device of the target machine).")
        elsewhere = "--device" in options
        if elsewhere:
            overrides = [f"accelerator={options['--device']}", *overrides]
        elif memory is not None:
            raise ConfigError("framework plan --device-memory: say which device too, e.g. --device cuda --device-memory "
                              "80GiB.")
        if "--recipe" in options:
            path = find_recipe(options["--recipe"])
            cfg = compose(path.parent, path.stem, overrides)
        else:
            cfg = compose(Path(conf_dir()), "train", overrides)
        return plan(cfg, device_memory=memory, elsewhere=elsewhere)
    except UserError as err:
        report(err)
        return ExitCode.USER_ERROR
