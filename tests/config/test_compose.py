"""Every option of every group composes, passes the schema and target checks, and builds."""
from __future__ import annotations

import pytest

from framework.config.targets import check_targets
from framework.config.validate import check_values
from framework.plugins import build_plugins
from tests.conftest import CONF, compose_cfg

# Groups whose options are nodes of the config (hparams_search writes into the global package and
# Hydra's own settings: tested below).
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in ("hparams_search", "hydra", "__pycache__"))
LIST_GROUPS = {"logger", "callbacks"}
# Options that only make sense together (an MLP classifies digits, it does not model text).
COMPANIONS = {("model", "mlp"): ["data=digits", "task=classification"],
              ("data", "digits"): ["model=mlp", "task=classification"],
              ("task", "classification"): ["model=mlp", "data=digits"],
              ("model", "gan"): ["data=gaussian_ring", "task=gan"],
              ("data", "gaussian_ring"): ["model=gan", "task=gan"],
              ("task", "gan"): ["model=gan", "data=gaussian_ring"],
              ("task", "grpo"): ["data=prompt_files"], ("data", "prompt_files"): ["task=grpo"]}
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((CONF / g).glob("*.yaml"))]


def test_every_design_option_ships():
    expected = {
        "accelerator": {"auto", "cpu", "cuda", "mps"},
        "strategy": {"auto", "single_device", "ddp", "ddp_spawn", "fsdp", "fsdp_cpu_offload", "deepspeed_stage_1",
                     "deepspeed_stage_2", "deepspeed_stage_2_offload", "deepspeed_stage_3", "deepspeed_stage_3_offload",
                     "deepspeed_stage_3_offload_nvme", "ddp_sharded", "fairscale_fsdp"},
        "precision": {"32", "64", "16", "bf16", "16_true", "bf16_true",
                      "bnb_int8", "bnb_nf4", "bnb_nf4_dq", "bnb_fp4"},
        "checkpoint_io": {"torch"},
        "cluster": {"auto", "local"},
    }
    for group, names in expected.items():
        assert names <= {f.stem for f in (CONF / group).glob("*.yaml")}, group


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_and_checks(group, option):
    choice = f"[{option}]" if group in LIST_GROUPS else option
    cfg = compose_cfg([f"{group}={choice}", *COMPANIONS.get((group, option), [])])
    check_values(cfg)
    check_targets(cfg)
    node = cfg[group]
    if group in LIST_GROUPS:
        assert list(node.keys()) == [option]
    else:
        assert "_target_" in node or group == "trainer"


@pytest.mark.parametrize("option", [f.stem for f in (CONF / "precision").glob("*.yaml")])
def test_precision_option_builds_with_its_name(option):
    plugins = build_plugins(compose_cfg([f"precision={option}"]))
    assert plugins.precision.name == option
    assert plugins.strategy.precision is plugins.precision


def test_config_and_code_trees_mirror():
    """conf/<group>/X.yaml targets framework/<group>/X.py for the five plugin groups
    (precision options are numbers, so their modules carry a prefix: framework/precision/__init__.py).
    Each file is read as it is (none has a defaults list, so its own _target_ is what composing it
    gives: one option a group is composed to show that)."""
    from omegaconf import OmegaConf

    precision_modules = {"32": "fp32", "64": "fp64", "16": "fp16_mixed", "bf16": "bf16_mixed",
                         "16_true": "fp16_true", "bf16_true": "bf16_true"}
    for group in ("accelerator", "strategy", "precision", "checkpoint_io", "cluster"):
        files = sorted((CONF / group).glob("*.yaml"))
        for f in files:
            module = precision_modules.get(f.stem, f.stem) if group == "precision" else f.stem
            node = OmegaConf.load(f)
            assert "defaults" not in node, f  # a defaults list could change the target: compose it instead
            assert node._target_.startswith(f"framework.{group}.{module}."), (f, node._target_)
        assert compose_cfg([f"{group}={files[-1].stem}"])[group]._target_ == OmegaConf.load(files[-1])._target_


def test_default_plugins():
    plugins = build_plugins(compose_cfg([]))
    assert (plugins.accelerator.name, plugins.strategy.name, plugins.precision.name,
            plugins.checkpoint_io.name, plugins.cluster.name) == ("cpu", "single_device", "32", "torch", "local")


def test_optuna_search_sets_the_sweeper_and_the_objective():
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("train", overrides=["hparams_search=digits_optuna"], return_hydra_config=True)
    assert "optuna" in cfg.hydra.sweeper._target_
    assert cfg.hydra.sweeper.direction == "maximize" and cfg.trainer.objective_mode == "max"
    assert cfg.trainer.objective == "val/accuracy"
    assert cfg.hydra.sweeper.sampler.seed == 1234
    assert set(cfg.hydra.sweeper.params) == {"optimizer.lr", "optimizer.weight_decay", "model.hidden"}
