"""Shipped recipes: each runs (a few steps, as CI does so none rots), from any directory; a
recipe outside the source tree composes the framework's groups; an installed wheel finds its own
conf/; every run directory's recipe.yaml reproduces the run's losses exactly."""
from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from framework.paths import builtin_recipes
from tests.cli.helpers import framework_cmd
from tests.conftest import ROOT, TINY_GPT
from tests.helpers.in_process import run_command

SHORT = ["trainer.max_steps=2", "trainer.val_every=2", "trainer.val_batches=1", "trainer.progress_bar=false",
         "trainer.log_every=1"]
SHORT_BY_RECIPE = {
    "digits_sweep_optuna": ["hydra.sweeper.n_trials=2"],
    "gpt_lr_sweep": ["data.max_bytes=200000", "model.n_layer=1", "model.block_size=32"],  # its 4 jobs, small
    "hf_gpt2_text": ["data.cache_dir=cache", "model.config.n_layer=1"],
    "gpt_deepspeed_stage_3_offload": ["data.max_bytes=200000", "model.n_layer=2", "model.n_embd=64"],
}
SWEEPS = {"digits_sweep_optuna", "gpt_lr_sweep"}


def losses(run_dir: Path) -> list[tuple[str, str]]:
    with open(run_dir / "metrics.csv") as f:
        return [(row["step"], row["train/loss"]) for row in csv.DictReader(f) if row.get("train/loss")]


def test_at_least_six_recipes_cover_the_plugin_space():
    from omegaconf import OmegaConf

    recipes = builtin_recipes()
    assert len(recipes) >= 6
    chosen = set()
    for path in recipes.values():
        for entry in OmegaConf.to_container(OmegaConf.load(path)).get("defaults", []):
            if isinstance(entry, dict):
                chosen.update(f"{k.split()[-1]}={v}" for k, v in entry.items())
    for needed in ("strategy=ddp", "strategy=fsdp", "strategy=deepspeed_stage_3_offload", "precision=bf16",
                   "hparams_search=digits_optuna", "checkpoint_io=dcp", "task=gan"):
        assert needed in chosen, needed


def test_the_getting_started_table_lists_every_builtin_recipe():
    import re

    page = (ROOT / "docs" / "getting-started.md").read_text()
    table = page.split("| recipe | what |", 1)[1].split("\n\n", 1)[0]
    assert set(re.findall(r"^\| `(\w+)` \|", table, re.M)) == set(builtin_recipes())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(builtin_recipes()))
def test_every_builtin_recipe_runs_a_few_steps(name, tmp_path):
    extra = SHORT_BY_RECIPE.get(name, ["data.max_bytes=300000"] if name.startswith("gpt") else [])
    # through the command's own entry in this process (its workers forked from this process's warm
    # forkserver); the tests below run recipes as real command lines
    result = run_command(["run", name, "name=ci", *SHORT, *extra], tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    if name in SWEEPS:
        with open(tmp_path / "multirun" / "ci" / "sweep_summary.csv") as f:
            rows = list(csv.DictReader(f))
        assert rows and all(r["status"] == "completed" and float(r["value"]) > 0 for r in rows)
        return
    summary = json.loads((tmp_path / "outputs" / "ci" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["objective_value"] is not None
    with open(tmp_path / "outputs" / "ci" / "metrics.csv") as f:
        trained = [r["step"] for r in csv.DictReader(f) if any(k.startswith("train/") and v for k, v in r.items())]
    assert trained == ["1", "2"]
    assert (tmp_path / "outputs" / "ci" / "recipe.yaml").is_file()
    if name == "hf_dpo_chat":  # GPT-2's dropout 0.1 off (task.disable_dropout): the first step is ln 2
        assert abs(float(losses(tmp_path / "outputs" / "ci")[0][1]) - math.log(2)) < 1e-6


@pytest.mark.slow
def test_a_recipe_outside_the_source_tree_runs_from_any_directory(tmp_path):
    """A teammate's single YAML file: `framework run path/to/recipe.yaml` from anywhere."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "teammate.yaml").write_text(textwrap.dedent("""\
        # a teammate's experiment
        defaults:
          - train
          - override model: mlp
          - override data: digits
          - override task: classification
          - _self_
        trainer:
          max_steps: 3
          val_every: 3
          progress_bar: false
          objective: val/accuracy
        """))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = framework_cmd("run", str(shared / "teammate.yaml"), "name=t", cwd=elsewhere)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((elsewhere / "outputs" / "t" / "summary.json").read_text())
    assert summary["objective"] == "val/accuracy" and 0 <= summary["objective_value"] <= 1
    missing = framework_cmd("run", str(shared / "nope.yaml"), cwd=elsewhere)
    assert missing.returncode == 2 and "no such file" in missing.stderr


@pytest.mark.slow
def test_recipe_yaml_reproduces_the_run(tmp_path):
    args = ["name=first", "trainer.max_steps=6", "trainer.val_every=3", *TINY_GPT, "trainer.log_every=1",
            "optimizer.lr=2e-3", "seed=7"]
    first = framework_cmd("train", *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    recipe = tmp_path / "outputs" / "first" / "recipe.yaml"
    text = recipe.read_text()
    import torch

    import framework

    assert f"framework {framework.__version__}" in text and f"torch {torch.__version__}" in text
    assert "deepspeed " in text and "# Source: git " in text
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert commit in text
    assert "defaults:" in text and "_target_: framework.models.gpt.GPT" in text and "seed: 7" in text
    # Re-run it from another directory, as a standalone file: the same losses, bit for bit.
    other = tmp_path / "other"
    other.mkdir()
    copy = other / "recipe.yaml"
    copy.write_text(text)
    again = framework_cmd("run", str(copy), "name=second", cwd=other)
    assert again.returncode == 0, again.stderr[-3000:]
    assert losses(other / "outputs" / "second") == losses(tmp_path / "outputs" / "first")
    assert len(losses(tmp_path / "outputs" / "first")) == 6


@pytest.mark.slow
def test_an_installed_wheel_finds_its_own_config_tree(tmp_path):
    """pip install of a built wheel (not the source tree): conf/ and the recipes come from the
    package (pkg://framework.conf), and a built-in recipe runs."""
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(wheels), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    wheel = next(wheels.glob("framework-*.whl"))
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                                str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    env = {"PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import framework.paths as p; print(p.conf_dir()); "
                            "print(p.recipes_dir())"], capture_output=True, text=True, cwd=tmp_path,
                           env={**__import__("os").environ, **env})
    conf, recipes = where.stdout.split()
    assert conf.startswith(str(site)) and recipes.startswith(str(site)), where.stdout + where.stderr
    assert (Path(conf) / "strategy" / "fsdp.yaml").is_file()
    result = framework_cmd("run", "digits_classifier", "name=w", *SHORT, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "outputs" / "w" / "summary.json").read_text())["status"] == "completed"


@pytest.mark.slow  # a compose and a preparation per strategy option: 20 s a recipe on a loaded 2-core machine
@pytest.mark.parametrize("name", sorted(builtin_recipes()))
def test_every_recipe_validates_and_swaps_to_every_strategy(name):
    """Every shipped recipe validates as shipped (what `framework validate` runs), and the one-key swap
    holds for the shipped recipes: under every strategy option each recipe
    composes and passes values, targets (no option a recipe sets that another strategy does not
    take) and constructors; what is left is the compatibility table's word on this machine and
    task (e.g. DeepSpeed refuses a task that steps two optimizers), given as the reason."""
    from framework.config.compose import composer
    from framework.paths import conf_dir
    from framework.preflight import prepare

    strategies = sorted(p.stem for p in (conf_dir() / "strategy").glob("*.yaml"))
    path = builtin_recipes()[name]
    with composer(path.parent) as compose_one:
        assert prepare(compose_one(path.stem, []), strict=False).problems == [], name  # as shipped
        for strategy in strategies:
            cfg = compose_one(path.stem, [f"strategy={strategy}"])
            prepared = prepare(cfg, strict=False)
            where = f"{name} strategy={strategy}: {prepared.problems}"
            assert prepared.plugins is not None and prepared.model is not None and prepared.devices, where
            if strategy in ("ddp", "fsdp"):  # these two take every shipped task
                assert prepared.problems == [], where
