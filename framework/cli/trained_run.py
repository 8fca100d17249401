"""The config and checkpoint of a finished run, for the commands after training (`framework
test`, `framework predict`): the run's own config composed again, with overrides on top, and the
checkpoint to load (the best by the run's monitor, or the one given)."""
from __future__ import annotations

import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from framework.checkpoint.format import read_meta
from framework.checkpoint.load import find_checkpoint
from framework.config.compose import compose
from framework.config.overrides import config_groups, normalize_overrides
from framework.errors import CheckpointError
from framework.paths import ALWAYS_PATHS, PATH_KEYS, absolute_path, make_importable
from framework.reproduce import standalone_recipe


def trained_run(target: str, overrides: list[str], command: str) -> tuple[DictConfig, Path, Path | None, str]:
    """(the config with ckpt_path set to the checkpoint, the checkpoint, its run directory or None,
    why that checkpoint) of `target`, a run or checkpoint directory. User errors are raised."""
    checkpoint, run_dir, why = find_checkpoint(Path(target).expanduser().resolve(), command)
    with tempfile.TemporaryDirectory(prefix="framework-") as scratch:
        cfg = compose_run_config(run_dir, checkpoint, overrides, Path(scratch))
    with open_dict(cfg):
        cfg.ckpt_path, cfg.resume = str(checkpoint), None
    return cfg, checkpoint, run_dir, why


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def merged_overrides(original: list[str], given: list[str]) -> list[str]:
    """The run's overrides with those the user gives now replacing any of the same key."""
    keys = {_key(o) for o in given}
    return [o for o in original if _key(o) not in keys and o not in ("-m", "--multirun")] + given


def compose_run_config(run_dir: Path | None, checkpoint: Path, overrides: list[str], scratch: Path):
    """The config that made the run, composed again with `overrides` on top: from its primary
    recipe and command-line overrides (.hydra/), else from the resolved config it saved (a
    standalone recipe: values may be overridden, group choices may not)."""
    hydra_dir = run_dir / ".hydra" if run_dir is not None else None
    if hydra_dir is not None and (hydra_dir / "hydra.yaml").is_file() and (hydra_dir / "overrides.yaml").is_file():
        hydra = OmegaConf.load(hydra_dir / "hydra.yaml").hydra
        sources = [s for s in hydra.runtime.config_sources if s.provider == "main"]
        config_dir = Path(sources[0].path) if sources else None
        changed = changed_groups(dict(hydra.runtime.get("choices") or {}), overrides)
        # Another option of a group (strategy=single_device for a model_parallel run): the run's
        # settings of that group (its overrides, its recipe's values) belong to the old option and
        # are dropped, which the resolved config below does group by group.
        if config_dir is not None:  # user code beside the run's recipe stays importable, whichever path composes
            make_importable(config_dir)
        if not changed and config_dir is not None and (config_dir / f"{hydra.job.config_name}.yaml").is_file():
            original = list(OmegaConf.load(hydra_dir / "overrides.yaml"))
            cfg = compose(config_dir, hydra.job.config_name, merged_overrides(original, overrides))
            return _paths_from(cfg, Path(hydra.runtime.cwd), overrides)
    saved = (run_dir / "config.yaml") if run_dir is not None else None
    config = OmegaConf.to_container(OmegaConf.load(saved)) if saved is not None else read_meta(checkpoint).get("config")
    if not config:
        raise CheckpointError(f"{checkpoint}: its meta.json records no config and it is not inside a run directory; "
                              "test the run directory that holds it.")
    recipe, values = with_group_choices(standalone_recipe(config), overrides)
    OmegaConf.save(OmegaConf.create(recipe), scratch / "recipe.yaml")
    return compose(scratch, "recipe", values)


def _paths_from(cfg: DictConfig, run_cwd: Path, overrides: list[str]) -> DictConfig:
    """The composed config with the run's relative paths made absolute against the directory the
    run started in (its overrides said `data.files=corpus/*.jsonl` there); paths given now stay
    relative to this directory."""
    given = {_key(o) for o in overrides}
    for key in PATH_KEYS:
        if key in given or OmegaConf.select(cfg, key, default=None) is None:
            continue
        value = OmegaConf.to_container(OmegaConf.create({"v": OmegaConf.select(cfg, key)}), resolve=True)["v"]
        always = key in ALWAYS_PATHS
        if isinstance(value, str):
            OmegaConf.update(cfg, key, absolute_path(value, run_cwd, always), merge=False)
        elif isinstance(value, list):
            OmegaConf.update(cfg, key, [absolute_path(v, run_cwd, always) if isinstance(v, str) else v for v in value],
                             merge=False)
    return cfg


def changed_groups(choices: dict, overrides: list[str]) -> set[str]:
    """The config groups whose option `overrides` changes from the run's `choices` (Hydra's record)."""
    groups, changed = config_groups(), set()
    for override in normalize_overrides(overrides, groups):
        key, _, choice = override.partition("=")
        if key in groups and choice and str(choices.get(key)) != choice.strip("'\""):
            changed.add(key)
    return changed


def with_group_choices(recipe: dict, overrides: list[str]) -> tuple[dict, list[str]]:
    """A standalone recipe spells every group out as a node; a group choice given now
    (`strategy=fsdp`) replaces that node by the option, through the recipe's defaults list.
    Returns the recipe and the overrides left to apply as values."""
    groups = config_groups()
    values, recipe = [], dict(recipe)
    for override in normalize_overrides(overrides, groups):
        key, _, choice = override.partition("=")
        if key in groups and choice and not key.startswith(("+", "~")):
            recipe.pop(key, None)
            parsed = OmegaConf.create({"choice": choice.strip("'")} if not choice.startswith("[") else
                                      {"choice": [c.strip(" '") for c in choice.strip("[]").split(",") if c.strip()]})
            recipe["defaults"] = [*recipe["defaults"][:-1], {key: parsed.choice}, recipe["defaults"][-1]]
        else:
            values.append(override)
    return recipe, values
