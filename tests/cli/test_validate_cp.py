"""`framework validate RECIPE` lists every problem; `framework cp` copies a built-in recipe."""
from __future__ import annotations

import textwrap

from tests.cli.helpers import framework_cmd


def test_validate_lists_every_problem_not_the_first(tmp_path):
    recipe = tmp_path / "broken.yaml"
    recipe.write_text(textwrap.dedent("""\
        defaults:
          - train
          - _self_
        trainer:
          max_steps: 0
          log_every: 0
        model:
          n_layers: 2
        optimizer:
          lr: fast
        """))
    result = framework_cmd("validate", str(recipe), cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    for fragment in ("4 problems", "trainer.max_steps=0", "trainer.log_every=0",
                     "model.n_layers: 'framework.models.gpt.GPT' takes no argument 'n_layers'", "optimizer.lr='fast'"):
        assert fragment in result.stderr, (fragment, result.stderr)
    assert "Traceback" not in result.stderr


def test_validate_checks_constructors_and_compatibility(tmp_path):
    recipe = tmp_path / "combo.yaml"
    recipe.write_text("defaults:\n  - train\n  - override strategy: deepspeed_stage_2\n  - override precision: '64'\n"
                      "  - _self_\ndevices: 2\nmodel:\n  n_head: 3\n")
    result = framework_cmd("validate", str(recipe), cwd=tmp_path)
    assert result.returncode == 2
    assert "model.n_head=3 must divide model.n_embd=128" in result.stderr
    assert "DeepSpeed has no float64 mode" in result.stderr


def test_validate_passes_a_builtin_recipe(tmp_path):
    # every built-in recipe is validated in-process by tests/recipes/test_recipes.py
    result = framework_cmd("validate", "gpt_ddp", cwd=tmp_path)
    assert result.returncode == 0 and "gpt_ddp.yaml: ok" in result.stdout, result.stderr


def test_validate_finds_settings_of_a_callback_left_out(tmp_path):
    """callbacks=[] on a recipe that sets callbacks.checkpoint.*: what run would crash on
    (a dict where a callback should be), validate says with the fix."""
    result = framework_cmd("validate", "digits_classifier", "callbacks=[checkpoint]", cwd=tmp_path)
    assert result.returncode == 2
    assert "callbacks.early_stopping: settings (monitor, mode, patience) for a callback that is not chosen" in result.stderr
    assert "callbacks.checkpoint" not in result.stderr
    assert framework_cmd("validate", "digits_classifier", "callbacks=[checkpoint,early_stopping]",
                         cwd=tmp_path).returncode == 0


def test_cp_copies_and_never_overwrites(tmp_path):
    result = framework_cmd("cp", "gpt_ddp", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    copied = tmp_path / "gpt_ddp.yaml"
    from framework.paths import builtin_recipes

    assert copied.read_text() == builtin_recipes()["gpt_ddp"].read_text()
    again = framework_cmd("cp", "gpt_ddp", str(copied), cwd=tmp_path)
    assert again.returncode == 2 and "already exists" in again.stderr
    typo = framework_cmd("cp", "gpt_dpp", str(tmp_path / "x.yaml"), cwd=tmp_path)
    assert typo.returncode == 2 and "Did you mean gpt_ddp?" in typo.stderr and not (tmp_path / "x.yaml").exists()
    named = framework_cmd("cp", "digits_classifier", str(tmp_path / "mine"), cwd=tmp_path)
    assert named.returncode == 0 and (tmp_path / "mine.yaml").is_file()


def test_validate_plan_and_run_find_user_code_beside_the_recipe(tmp_path):
    """The three run the same preparation, so they find a module beside the recipe alike."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "vision.py").write_text(textwrap.dedent("""\
        from torch import nn


        class SmallMLP(nn.Module):
            def __init__(self, in_features: int = 64, hidden: int = 16, depth: int = 1, num_classes: int = 10,
                         dropout: float = 0.0):
                super().__init__()
                self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(),
                                         nn.Linear(hidden, num_classes))

            def forward(self, x):
                return self.net(x)
        """))
    (folder / "my.yaml").write_text(textwrap.dedent("""\
        defaults:
          - train
          - override data: digits
          - override task: classification
          - override model: mlp
          - _self_
        model:
          _target_: vision.SmallMLP
        trainer: {max_steps: 2, val_every: 2}
        """))
    env = {"FRAMEWORK_TRUST_ALLOW": "vision."}
    mlp_only = []
    validated = framework_cmd("validate", str(folder / "my.yaml"), *mlp_only, cwd=tmp_path, env=env)
    assert validated.returncode == 0 and "ok" in validated.stdout, validated.stderr
    planned = framework_cmd("plan", "-r", str(folder / "my.yaml"), *mlp_only, cwd=tmp_path, env=env)
    assert planned.returncode == 0 and "SmallMLP: 9,610 trainable parameters" in planned.stdout, planned.stderr
    typo = framework_cmd("validate", str(folder / "my.yaml"), *mlp_only, "model._target_=visoin.SmallMLP",
                         cwd=tmp_path, env=env)
    assert typo.returncode == 2 and "no module named 'visoin' can be found. Did you mean vision?" in typo.stderr
