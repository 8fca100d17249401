from framework.config.overrides import quote_numeric_choices


def test_numeric_precision_choices_are_quoted():
    assert quote_numeric_choices(["precision=16", "precision=32,bf16", "+precision=64"]) == [
        "precision='16'", "precision='32',bf16", "+precision='64'"]


def test_other_keys_are_untouched():
    args = ["trainer.max_steps=16", "precision.init_scale=2", "precision=bf16_true", "devices=2", "-m"]
    assert quote_numeric_choices(args) == args
