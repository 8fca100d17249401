"""Model, data and task built and tried together before launch: the model on the meta device (no
memory, no initialisation), the data's own checks (its files, the paths it writes, what testing
needs of it), one example batch through model and task (the shapes fit; the activations one
micro-batch keeps for backward, measured), the metrics a validation logs."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf
from torch.nn.parameter import UninitializedParameter

from framework.config.build import build
from framework.construction.activation_checkpointing import checkpoint_units
from framework.construction.meta_build import meta_device
from framework.data.batch_kinds import check_batches
from framework.data.tokenizer import tokenizer_mismatch
from framework.errors import ConfigError
from framework.loop.state import RunMode
from framework.models.build import build_model
from framework.paths import check_creatable_dir
from framework.plugins import Plugins
from framework.tasks.fit_check import check_compilable, check_fit, validation_metric_names
from framework.tasks.frozen import handed_over, inspect_frozen


def build_components(cfg: DictConfig, plugins: Plugins | None = None,
                     mode: RunMode = RunMode(), warnings: list | None = None) -> tuple[object, int, set[str] | None,
                                                                                   tuple[str, int]]:
    """Build the model (on the meta device: no memory, no init cost), data module and task once,
    so an argument their constructors refuse is reported before anything is written, and pass one
    batch through them (framework/tasks/fit_check.py); returns the meta model (its size is what
    `framework plan` reports) and the activation bytes of one micro-batch (what the forward keeps
    for backward; with trainer.activation_checkpointing the units' inputs and one unit's
    activations, live again while backward recomputes it), the metric names a validation logs, and
    a frozen second model's key and parameters (a reference, a teacher: ("", 0) where none)."""
    with meta_device():
        model = build_model(cfg.model)
        if cfg.get("adapter"):  # the adapter's layers, and its refusals (targets, rank), before launch
            model = build(cfg.adapter, "adapter").apply(model)
    data = build(cfg.data, "data")
    for key, (path, fix) in data.written_paths().items():
        check_creatable_dir(path, key, fix)
    sources = data.problems() + test_split_problems(cfg, data, mode) + data.run_problems(cfg.trainer, mode.name)
    if sources:
        raise ConfigError("\n".join(sources))
    if warnings is not None:
        warnings.extend(data.warnings())
    mismatch = tokenizer_mismatch(cfg.model.get("pretrained"), data)
    if mismatch:
        raise ConfigError(mismatch)
    task = build(cfg.task, "task")
    check_batches(task, data)
    misfits = task.problems_with(data, model)
    if misfits:
        raise ConfigError("\n".join(misfits))
    frozen = task.frozen_source()
    found, parameters = inspect_frozen(frozen, cfg, data, model)
    if found:
        raise ConfigError("\n".join(found))
    second = (frozen.key, parameters) if frozen is not None else ("", 0)
    if frozen is not None:  # the shapes tried with the model itself in the frozen one's place
        task.use_frozen(handed_over(frozen, cfg.get("adapter"), lambda: model))
    if mode.name == "predict" and not task.can_predict:
        raise ConfigError(f"framework predict: the task ({type(task).__name__}) defines no predict_step; give it one "
                          "(what it predicts for each sample: framework/tasks/base.py), or use a built-in task.")
    batch_size = int(cfg.data.get("batch_size", 2) or 2)
    whole, logged = _fitted(cfg, model, data, task, batch_size, device_type(plugins))
    if not data.validates():  # data.val_percent=0: nothing is validated, so no val/ metric is ever logged
        logged = set()
    if plugins is not None and cfg.trainer.get("compile"):
        check_compilable(model, data, task, plugins.strategy, bool(cfg.trainer.get("activation_checkpointing")))
    if plugins is None or not cfg.trainer.get("activation_checkpointing"):
        return model, whole, logged, second
    count = checkpoint_units(plugins.strategy.units(model))
    kept = check_fit(model, data, task, batch_size, device_type(plugins))
    return model, kept + (max(whole - kept, 0) // count if count else 0), logged, second


_FITTED: dict[str, tuple[int, set[str] | None]] = {}  # a process's fit checks that passed, by what they depend on
_FITTED_KEPT = 64


def _fitted(cfg: DictConfig, model, data, task, batch_size: int, device: str) -> tuple[int, set[str] | None]:
    """check_fit's activation bytes and the validation's metric names: run once per process for
    the same model, adapter, task, data, batch and device (the meta forwards are most of a
    preparation; a sweep's jobs, or one recipe under every strategy, share them), else again. A
    model with lazy modules is always run (the forward gives them their shapes)."""
    try:
        nodes = [cfg.get(name) for name in ("model", "adapter", "task", "data")]
        key = "\n".join([OmegaConf.to_yaml(n, resolve=True) if isinstance(n, DictConfig) else repr(n) for n in nodes]
                        + [str(batch_size), device])
    except Exception:  # a value that does not resolve here: no memo, the checks run
        key = None
    lazy = any(isinstance(p, UninitializedParameter) for p in model.parameters())
    if key is not None and not lazy and key in _FITTED:
        return _FITTED[key]
    found = check_fit(model, data, task, batch_size, device), validation_metric_names(model, data, task)
    if key is not None and not lazy:
        if len(_FITTED) >= _FITTED_KEPT:
            _FITTED.pop(next(iter(_FITTED)))
        _FITTED[key] = found
    return found


def device_type(plugins: Plugins | None) -> str:
    """The device the run computes on (whose attention kernels the activations are measured for)."""
    return plugins.accelerator.name if plugins is not None else "cpu"


def test_split_problems(cfg: DictConfig, data, mode: RunMode) -> list[str]:
    """Testing (`framework test`, trainer.test_at_end, predictions of the test split) needs data
    with a test split; predictions of the validation split, one (data.val_percent=0 holds none)."""
    if mode.name == "predict" and mode.split == "val" and not data.validates():
        return ["framework predict --split val: the data has no validation split (data.val_percent=0 holds none "
                "out); predict another split (--split test or train), or hold one out."]
    if mode.name == "test":
        asked = "framework test"
    elif mode.name == "predict" and mode.split == "test":
        asked = "framework predict --split test"
    elif cfg.trainer.get("test_at_end"):
        asked = "trainer.test_at_end=true"
    else:
        return []
    if data.has_test_split:
        return []
    return [f"{asked}: the data ({type(data).__name__}) has no test split. "
            f"{data.test_split_hint(trained=mode.name != 'fit')}"]
