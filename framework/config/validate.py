"""Value checks on the schema's own keys (the dataclasses check types; this checks ranges)."""
from __future__ import annotations

from dataclasses import fields

from omegaconf import DictConfig

from framework.config.groups import PLUGIN_GROUPS
from framework.config.schema import NONFINITE_POLICIES, TrainConfig, TrainerConfig
from framework.errors import ConfigError, did_you_mean
from framework.signals import is_signal_name

# (key, predicate on the value, what the value must be)
_RULES = [
    ("trainer.max_steps", lambda v: v is None or v >= 1, "a positive integer or null"),
    ("trainer.max_epochs", lambda v: v is None or v >= 1, "a positive integer or null"),
    ("trainer.val_every", lambda v: v >= 1, "a positive integer"),
    ("trainer.val_batches", lambda v: v is None or v >= 1, "a positive integer or null"),
    ("trainer.test_batches", lambda v: v is None or v >= 1, "a positive integer or null"),
    ("trainer.accumulate", lambda v: v >= 1, "a positive integer"),
    ("trainer.clip_grad_norm", lambda v: v is None or v > 0, "a positive number or null"),
    ("trainer.clip_grad_value", lambda v: v is None or v > 0, "a positive number or null"),
    ("trainer.log_every", lambda v: v >= 1, "a positive integer"),
    ("trainer.max_restarts", lambda v: v >= 0, "zero or a positive integer"),
    ("num_nodes", lambda v: v >= 1, "a positive integer"),
    (
        "devices",
        lambda v: v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1),
        "a positive integer or 'auto'",
    ),
    ("resume", lambda v: v in (None, "auto"), "'auto' or null"),
    ("trainer.objective_mode", lambda v: v in ("min", "max"), "'min' or 'max'"),
    ("trainer.on_nonfinite", lambda v: v in NONFINITE_POLICIES, "'stop', 'skip' or 'warn'"),
    ("trainer.nonfinite_skip_limit", lambda v: v >= 0, "zero (no limit) or a positive integer"),
]


def _get(cfg: DictConfig, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


def unknown_keys(cfg: DictConfig) -> list[str]:
    """Keys under a node with a schema that the schema does not have. Hydra refuses such a key
    unless it was added with `+` (`+trainer.max_stepz=10`), which it then accepts in silence;
    nothing would read it, so it is refused like the same typo without `+`."""
    problems = []
    for node, schema, prefix in ((cfg, TrainConfig, ""), (cfg.get("trainer"), TrainerConfig, "trainer.")):
        if not isinstance(node, DictConfig):
            continue
        known = [f.name for f in fields(schema)]
        for key in node.keys():
            if key not in known and key != "hydra":
                problems.append(f"{prefix}{key}: no such key, and nothing reads it (it was added with "
                                f"+{prefix}{key}=...).{did_you_mean(str(key), known)} `python train.py --cfg job` "
                                "prints every key.")
    return problems


def check_values(cfg: DictConfig) -> None:
    problems = unknown_keys(cfg)
    for key, ok, expected in _RULES:
        value = _get(cfg, key)
        if not ok(value):
            problems.append(f"{key}={value!r}: must be {expected}.")
    t = cfg.trainer
    if t.max_steps is None and t.max_epochs is None:
        problems.append("trainer.max_steps and trainer.max_epochs are both null: set one, e.g. trainer.max_steps=500.")
    for name in cfg.trainer.preemption_signals:
        if not is_signal_name(name):
            problems.append(f"trainer.preemption_signals: {name!r} is not a signal name (e.g. SIGTERM, SIGUSR1).")
    if cfg.ckpt_path is not None and cfg.resume is not None:
        problems.append(f"ckpt_path={cfg.ckpt_path!r} and resume={cfg.resume!r} both choose a checkpoint: give one.")
    for group in (*PLUGIN_GROUPS, "model", "data", "task", "optimizer"):
        node = cfg[group]
        if not isinstance(node, DictConfig) or "_target_" not in node:
            problems.append(f"{group}: must be a config with a _target_ (choose an option from conf/{group}/).")
    adapter = cfg.get("adapter")
    if isinstance(adapter, DictConfig) and "_target_" not in adapter:  # a recipe's settings, its adapter not chosen
        keys = [str(k) for k in adapter.keys()]
        problems.append(f"adapter: settings ({', '.join(keys)}) for an adapter that is not chosen: adapter=null (or "
                        "~adapter) left the adapter out while a recipe or an override still sets adapter.*. Choose "
                        f"one (adapter=lora), or drop its settings too ({' '.join(f'~adapter.{k}' for k in keys)}).")
    for group, noun in (("callbacks", "callback"), ("logger", "logger")):
        for name, node in (cfg.get(group) or {}).items():
            if node is None or (isinstance(node, DictConfig) and "_target_" in node):
                continue
            keys = ", ".join(str(k) for k in node.keys()) if isinstance(node, DictConfig) else repr(node)
            problems.append(f"{group}.{name}: settings ({keys}) for a {noun} that is not chosen: {group}=[...] left "
                            f"{name} out while a recipe or an override still sets {group}.{name}.*. Add {name} to "
                            f"{group}=[...], or drop its settings (~{group}.{name}).")
    if problems:
        raise ConfigError("\n".join(problems) if len(problems) > 1 else problems[0])
