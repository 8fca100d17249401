from framework.config.overrides import config_groups, normalize_overrides


def test_numeric_precision_choices_are_quoted():
    assert normalize_overrides(["precision=16", "precision=32,bf16", "+precision=64"]) == [
        "precision='16'", "precision='32',bf16", "+precision='64'"]


def test_a_null_group_choice_drops_the_group():
    assert normalize_overrides(["scheduler=null", "logger=null"]) == ["~scheduler", "logger=[]"]


def test_other_keys_are_untouched():
    args = ["trainer.max_steps=16", "precision.init_scale=2", "precision=bf16_true", "devices=2", "-m",
            "ckpt_path=null", "scheduler.total_steps=null"]
    assert normalize_overrides(args) == args


def test_groups_come_from_the_config_tree():
    assert {"accelerator", "strategy", "precision", "checkpoint_io", "cluster", "scheduler"} <= config_groups()


def test_a_sweep_rerun_with_resume_auto_finds_its_sweep(tmp_path):
    from omegaconf import OmegaConf

    from framework.config.overrides import pin_sweep_name

    root = tmp_path / "multirun"
    for name, overrides in (("2026-01-01/10-00-00", ["optimizer.lr=1e-3,3e-3"]),
                            ("2026-01-02/10-00-00", ["optimizer.lr=1e-3,3e-3", "seed=2"])):
        (root / name).mkdir(parents=True)
        OmegaConf.save(OmegaConf.create({"config_name": "train", "overrides": [*overrides, "hydra.mode=MULTIRUN"]}),
                       root / name / "sweep.yaml")
    again = pin_sweep_name(["-m", "optimizer.lr=1e-3,3e-3", "resume=auto"], root=root)
    assert again[-1] == "name=2026-01-01/10-00-00"
    other_recipe = pin_sweep_name(["-m", "optimizer.lr=1e-3,3e-3", "resume=auto"], config_name="gpt_ddp", root=root)
    assert other_recipe[-1].startswith("name=") and other_recipe[-1] != "name=2026-01-01/10-00-00"
    single_run = ["optimizer.lr=1e-3", "resume=auto"]
    assert pin_sweep_name(single_run, root=root) == single_run  # not a sweep: nothing to find
    recipe_sweep = pin_sweep_name(["optimizer.lr=1e-3,3e-3", "resume=auto"], root=root, recipe_sweeps=True)
    assert recipe_sweep[-1] == "name=2026-01-01/10-00-00"
    named = ["-m", "seed=1,2", "name=mine"]
    assert pin_sweep_name(named, root=root) == named
