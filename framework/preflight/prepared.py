"""`prepare`: steps 1 and 2 of a run (validate, build) as one pipeline, touching no device and
starting no process; every problem collected, not the first."""
from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from framework.accelerator.planned import planned
from framework.cluster.planned import planned_cluster
from framework.config.compatibility import judge
from framework.config.loop_settings import loop_settings
from framework.config.plan_facts import Plan, processes_per_node
from framework.config.targets import check_targets
from framework.config.validate import check_values
from framework.errors import ConfigError, UserError
from framework.loop.state import RunMode
from framework.paths import with_absolute_paths
from framework.plugins import Plugins, build_plugins
from framework.preflight.components import build_components
from framework.preflight.memory import memory_refusal
from framework.preflight.monitors import monitor_problems


@dataclass
class Prepared:
    """A config through the one preparation pipeline: what it resolved to, the plugins, the world
    and the model built on the meta device, or the problems found (every one, not the first)."""

    problems: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)  # the compatibility table's share of the problems
    warnings: list[str] = field(default_factory=list)
    config: dict | None = None  # the resolved config as plain containers (what workers receive)
    resolved: DictConfig | None = None
    plugins: Plugins | None = None
    devices: int | None = None
    model: object = None  # built on the meta device: no memory, no initialisation
    activation_bytes: int = 0  # what one micro-batch's forward keeps for backward (measured on meta)
    logged: set[str] | None = None  # the metric names a validation logs (None: not known before the run)
    second_model: tuple[str, int] = ("", 0)  # a task's frozen second model: its key and parameters (framework/tasks/frozen.py)

    @property
    def processes_per_node(self) -> int:
        return processes_per_node(self.plugins.strategy, self.devices)

    @property
    def world_size(self) -> int:
        """Processes in the whole job (one per device, or one per node under SPMD)."""
        return self.processes_per_node * self.resolved.num_nodes

    def raise_problems(self) -> "Prepared":
        if self.problems:
            raise ConfigError("\n".join(self.problems))
        return self


def prepare(cfg: DictConfig, strict: bool = True, mode: RunMode = RunMode(), device_memory: int | None = None,
            elsewhere: bool = False) -> Prepared:
    """Steps 1 and 2 of a run, and all of `framework validate` and `framework plan`: resolve the
    config, check values and every `_target_` (trust, imports, signatures), build the plugins,
    build model (on the meta device), data and task, and judge the combination. Touches no device
    and starts no process. Every problem is collected; `strict` raises them as one ConfigError.
    `mode`: fit, test (`framework test`: the data must have a test split) or predict (the task
    must predict, the data have the split). `elsewhere` (`framework plan --device`): judged for a
    machine that has the configured accelerator, with `device_memory` bytes per device."""
    prepared = Prepared()
    problems = prepared.problems

    def attempt(step):
        try:
            return step()
        except UserError as err:
            problems.extend(str(err).splitlines())
            return None

    try:
        prepared.config = with_absolute_paths(OmegaConf.to_container(cfg, resolve=True))
    except OmegaConfBaseException as err:
        verdict = _user_error_inside(err)
        if verdict is not None:  # a resolver's own verdict (a tokenizer file that is missing)
            problems.extend(str(verdict).splitlines())
            return prepared.raise_problems() if strict else prepared
        key = getattr(err, "full_key", None) or "config"
        problems.append(f"{key}: {str(err).splitlines()[0]} (an interpolation points to a key this combination "
                        "of options does not have)")
        return prepared.raise_problems() if strict else prepared
    resolved = prepared.resolved = OmegaConf.create(prepared.config)
    attempt(lambda: check_values(resolved))
    attempt(lambda: check_targets(resolved))
    if not problems:  # building from a config that failed those would only repeat them
        prepared.plugins = attempt(lambda: build_plugins(resolved))
        if prepared.plugins is not None and elsewhere:
            plugins = prepared.plugins
            plugins.accelerator = plugins.strategy.accelerator = planned(plugins.accelerator, device_memory)
            plugins.cluster = planned_cluster(plugins.cluster)  # its scheduler's launcher starts the processes there
        prepared.model, prepared.activation_bytes, prepared.logged, prepared.second_model = attempt(
            lambda: build_components(resolved, prepared.plugins, mode, prepared.warnings)) or (None, 0, None, ("", 0))
    if prepared.plugins is not None:
        plugins = prepared.plugins
        prepared.devices = attempt(lambda: plugins.fault_tolerance.resolve_devices(plugins.accelerator, resolved.devices))
    if prepared.devices is not None:
        plan = compatibility_plan(prepared.plugins, resolved, prepared.devices, mode.name)
        prepared.refusals, judged = judge(plan)
        prepared.warnings.extend(judged)
        problems.extend(prepared.refusals)
        wrong, untouched = monitor_problems(resolved, prepared.logged if mode.name == "fit" else None)
        problems.extend(wrong)
        prepared.warnings.extend(untouched)
        if not prepared.refusals:  # the engine behind the strategy judges its own settings last
            prepared.plugins.strategy.configure_loop(plan.loop)
            if prepared.model is not None:
                problems.extend(prepared.plugins.precision.model_problems(prepared.model))
            problems.extend(prepared.plugins.strategy.problems(prepared.model))
            problems.extend(prepared.plugins.fault_tolerance.problems())
            strategy = prepared.plugins.strategy
            if prepared.model is not None and not problems:
                # a pipeline rank keeps its stages' layers' activations of the microbatches in flight
                share = strategy.layout(strategy.devices * strategy.num_nodes, prepared.model).activation_share
                prepared.activation_bytes = int(prepared.activation_bytes * share)
            too_large = memory_refusal(prepared) if prepared.model is not None and not problems else None
            if too_large:
                prepared.refusals.append(too_large)
                problems.append(too_large)
    return prepared.raise_problems() if strict else prepared


def _user_error_inside(err: BaseException) -> UserError | None:
    """The user error a resolver raised, from inside OmegaConf's wrapping of it (a chain of causes)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, UserError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def compatibility_plan(plugins: Plugins, resolved: DictConfig, devices: int, mode: str = "fit") -> Plan:
    """What the compatibility table judges: the built plugins, the world, the loop settings and
    what the run does (fit, test, predict)."""
    return Plan(plugins.accelerator, plugins.strategy, plugins.precision, plugins.checkpoint_io, plugins.cluster,
                devices, resolved.num_nodes, loop_settings(resolved), plugins.fault_tolerance, mode)
