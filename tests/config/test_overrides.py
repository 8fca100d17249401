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
