"""Trusted targets: recipes are code, so every `_target_` is checked against an allow-list
(framework, torch, and what the user allows from outside the recipe) before anything runs."""
from __future__ import annotations

import textwrap

import pytest
from omegaconf import OmegaConf

from framework.config.trust import check_hydra_settings, check_trusted, split_command_line
from framework.errors import ConfigError
from tests.cli.helpers import framework_cmd
from tests.conftest import compose_cfg

HOSTILE = {
    "top_level": "model:\n  _target_: os.system\n  command: touch {marker}\n",
    "nested": ("callbacks:\n  checkpoint:\n    extra:\n      deeper:\n        - _target_: subprocess.run\n"
               "          args: [touch, {marker}]\n"),
    "through_a_trusted_module": ("model:\n  _target_: framework.reproduce.subprocess.run\n"
                                 "  args: [touch, {marker}]\n"),
    "builtins_eval": "model:\n  _target_: builtins.eval\n  source: \"__import__('os').system('touch {marker}')\"\n",
    "torch_hub": "model:\n  _target_: torch.hub.load\n  repo_or_dir: /tmp\n  model: x\n  source: local\n",
    "allows_itself": "trust:\n  allow: [os.]\nmodel:\n  _target_: os.system\n  command: touch {marker}\n",
    "hydra_callback": "hydra:\n  callbacks:\n    evil:\n      _target_: os.system\n      command: touch {marker}\n",
    "hydra_env": ("hydra:\n  job:\n    env_set:\n      FRAMEWORK_TRUST_ALLOW: os.\nmodel:\n  _target_: os.system\n"
                  "  command: touch {marker}\n"),
}
EXPECTED = {
    "top_level": "model._target_=os.system is not in the trusted targets",
    "nested": "callbacks.checkpoint.extra.deeper[0]._target_=subprocess.run is not in the trusted targets",
    "through_a_trusted_module": "resolves to code in the module 'subprocess', which is not trusted",
    "builtins_eval": "model._target_=builtins.eval is not in the trusted targets",
    "torch_hub": "model._target_=torch.hub.load is not in the trusted targets",
    "allows_itself": "trust: a recipe cannot extend the trusted targets",
    "hydra_callback": "hydra.callbacks.evil._target_=os.system is not in the trusted targets",
    "hydra_env": "hydra.job.env_set.FRAMEWORK_TRUST_ALLOW: a recipe cannot set the trust settings",
}


@pytest.fixture(autouse=True)
def no_user_trust(monkeypatch, tmp_path):
    monkeypatch.delenv("FRAMEWORK_TRUST_ALLOW", raising=False)
    monkeypatch.setenv("FRAMEWORK_TRUST_FILE", str(tmp_path / "no-trust-file.yaml"))


def test_shipped_config_is_trusted():
    check_trusted(compose_cfg([]))
    check_trusted(compose_cfg(["strategy=deepspeed_stage_3", "logger=[csv,tensorboard,mlflow]", "optimizer=sgd"]))


@pytest.mark.parametrize("target", ["os.system", "subprocess.Popen", "builtins.eval", "torch.hub.load",
                                    "torch.load", "torch.utils.cpp_extension.load", "framework.reproduce.subprocess.Popen",
                                    "framework.cli.main", "torch.nn.modules.linear.torch.hub.load"])
def test_untrusted_targets_are_refused(target):
    with pytest.raises(ConfigError, match="refused before anything was imported or run"):
        check_trusted({"model": {"_target_": target}})


def test_allow_from_the_environment_and_the_user_file(monkeypatch, tmp_path):
    config = {"model": {"_target_": "collections.OrderedDict"}}
    with pytest.raises(ConfigError, match="collections."):
        check_trusted(config)
    monkeypatch.setenv("FRAMEWORK_TRUST_ALLOW", "json.,collections.")
    check_trusted(config)
    monkeypatch.delenv("FRAMEWORK_TRUST_ALLOW")
    trust_file = tmp_path / "trust.yaml"
    trust_file.write_text("allow: [collections.OrderedDict]\n")
    monkeypatch.setenv("FRAMEWORK_TRUST_FILE", str(trust_file))
    check_trusted(config)
    with pytest.raises(ConfigError):  # an exact name allows that name only
        check_trusted({"model": {"_target_": "collections.Counter"}})
    trust_file.write_text("allow: collections.\n")
    with pytest.raises(ConfigError, match="must hold `allow: \\[prefix, ...\\]`"):
        check_trusted(config)


def test_a_recipe_cannot_allow_itself_even_when_the_user_allowed_the_target(monkeypatch):
    monkeypatch.setenv("FRAMEWORK_TRUST_ALLOW", "collections.")
    with pytest.raises(ConfigError, match="a recipe cannot extend the trusted targets"):
        check_trusted({"trust": {"allow": ["os."]}, "model": {"_target_": "collections.OrderedDict"}})


def test_command_line_allow_is_taken_out_of_the_overrides():
    rest, allowed = split_command_line(["model=mlp", "trust.allow=[mypkg.,other.Mod]", "+trust.allow=x."])
    assert rest == ["model=mlp"] and allowed == ["mypkg.", "other.Mod", "x."]


def test_hydra_settings_are_checked_too():
    check_hydra_settings(compose_cfg_with_hydra(["hparams_search=digits_optuna"]).hydra)
    with pytest.raises(ConfigError, match="hydra.callbacks.evil._target_=os.system"):
        check_hydra_settings(OmegaConf.create({"callbacks": {"evil": {"_target_": "os.system"}}}))


def compose_cfg_with_hydra(overrides):
    from hydra import compose, initialize_config_dir

    from tests.conftest import CONF

    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("train", overrides=overrides, return_hydra_config=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_recipe_is_refused_before_anything_runs(name, tmp_path):
    marker = tmp_path / "PWNED"
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text("defaults:\n  - train\n  - _self_\n" + HOSTILE[name].format(marker=marker))
    for command in (["run", str(recipe), "trainer.max_steps=1"], ["run", str(recipe), "-m", "seed=1,2"]):
        result = framework_cmd(*command, cwd=tmp_path, in_process=True)
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert EXPECTED[name] in result.stderr and "Traceback" not in result.stderr
        assert not marker.exists()
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()


@pytest.mark.slow
def test_the_user_allows_a_package_from_the_command_line_the_environment_or_a_file(tmp_path):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(textwrap.dedent("""\
        import torch

        class Tiny(torch.nn.Module):
            def __init__(self, hidden: int = 16):
                super().__init__()
                self.net = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))

            def forward(self, x):
                return self.net(x)
        """))
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("defaults:\n  - train\n  - _self_\nmodel:\n  _target_: mypkg.nets.Tiny\n  hidden: 8\n")
    args = ["run", str(recipe), "~model", "data=digits", "task=classification", "trainer.max_steps=2",
            "trainer.val_every=2", "trainer.progress_bar=false"]
    env = {"PYTHONPATH": str(tmp_path)}
    refused = framework_cmd(*args, "name=a", cwd=tmp_path, env=env, in_process=True)
    assert refused.returncode == 2 and "trust.allow=[mypkg.nets.]" in refused.stderr
    by_command_line = framework_cmd(*args, "name=b", "trust.allow=[mypkg.]", cwd=tmp_path, env=env, in_process=True)
    assert by_command_line.returncode == 0, by_command_line.stderr[-2000:]
    by_environment = framework_cmd(*args, "name=c", cwd=tmp_path, env={**env, "FRAMEWORK_TRUST_ALLOW": "mypkg."}, in_process=True)
    assert by_environment.returncode == 0, by_environment.stderr[-2000:]
    trust_file = tmp_path / "trust.yaml"
    trust_file.write_text("allow: [mypkg.nets.Tiny]\n")
    by_file = framework_cmd(*args, "name=d", cwd=tmp_path, env={**env, "FRAMEWORK_TRUST_FILE": str(trust_file)}, in_process=True)
    assert by_file.returncode == 0, by_file.stderr[-2000:]
    # the run's recipe.yaml does not carry the permission: re-running it needs the user's allow again
    rerun = framework_cmd("run", str(tmp_path / "outputs" / "b" / "recipe.yaml"), "name=e", cwd=tmp_path, env=env, in_process=True)
    assert rerun.returncode == 2 and "mypkg.nets.Tiny is not in the trusted targets" in rerun.stderr
