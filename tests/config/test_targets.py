"""Signature-based checks of `_target_` nodes: every problem is reported with its key."""
from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

from framework.config.targets import check_targets
from framework.errors import ConfigError


def check(tree: dict):
    check_targets(OmegaConf.create(tree))


def test_unknown_argument_names_key_and_lists_valid_ones():
    with pytest.raises(ConfigError, match=r"model\.widht: .*takes no argument 'widht'.*n_embd"):
        check({"model": {"_target_": "framework.models.gpt.GPT", "widht": 3}})


@pytest.mark.parametrize("key,value,expected", [
    ("n_layer", "two", "must be an integer"),
    ("n_layer", 0, "must be a number > 0"),
    ("dropout", -0.5, "must be a number >= 0"),
    ("n_layer", True, "must be an integer"),
])
def test_types_and_bounds(key, value, expected):
    with pytest.raises(ConfigError, match=rf"model\.{key}=.*{expected}"):
        check({"model": {"_target_": "framework.models.gpt.GPT", key: value}})


def test_literal_choices():
    with pytest.raises(ConfigError, match=r"callbacks\.es\.mode='minimum': must be one of 'min', 'max'"):
        check({"callbacks": {"es": {"_target_": "framework.callbacks.early_stopping.EarlyStopping",
                                    "mode": "minimum"}}})


def test_inherited_keyword_arguments_are_checked():
    with pytest.raises(ConfigError, match=r"data\.batchsize: .*takes no argument"):
        check({"data": {"_target_": "framework.data.digits.Digits", "batchsize": 3}})
    check({"data": {"_target_": "framework.data.digits.Digits", "batch_size": 3}})


def test_required_argument_missing_unless_partial():
    with pytest.raises(ConfigError, match=r"scheduler\.total_steps: required"):
        check({"scheduler": {"_target_": "framework.scheduler.cosine.warmup_cosine", "optimizer": None}})
    check({"scheduler": {"_target_": "framework.scheduler.cosine.warmup_cosine", "_partial_": True}})
    with pytest.raises(ConfigError, match=r"task\.label_smoothing"):
        check({"task": {"_target_": "framework.tasks.classification.Classification", "label_smoothing": None}})


@pytest.mark.parametrize("target,message", [
    ("framework.models.gtp.GPT", "the package 'framework.models' has no module or name 'gtp'. Did you mean gpt?"),
    ("framework.models.gpt.GTP", "the module 'framework.models.gpt' has no 'GTP'. Did you mean GPT?"),
    ("my_models.Net", "no module 'my_models' can be imported .* beside the recipe"),
])
def test_an_unimportable_target_says_whether_the_module_or_the_name_is_missing(target, message, monkeypatch):
    monkeypatch.setenv("FRAMEWORK_TRUST_ALLOW", "my_models.")  # trusted, so the import is what fails
    with pytest.raises(ConfigError, match=rf"model\._target_={re.escape(target)}: {message}"):
        check({"model": {"_target_": target}})


def test_every_problem_is_listed_not_just_the_first():
    with pytest.raises(ConfigError) as err:
        check({"model": {"_target_": "framework.models.gpt.GPT", "n_layer": -1, "colour": 1},
               "task": {"_target_": "framework.tasks.classification.Classification", "label_smoothing": "x"}})
    text = str(err.value)
    assert "model.n_layer" in text and "model.colour" in text and "task.label_smoothing" in text


def test_torch_optimizer_learning_rate_type():
    with pytest.raises(ConfigError, match=r"optimizer\.lr='fast'"):
        check({"optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": "fast"}})


def test_an_option_that_needs_a_missing_package_is_named_by_its_key(monkeypatch):
    """Built, not only imported: a constructor that imports what this machine lacks (an attention
    kernel, a codec) ends in one paragraph naming the key, exit 2, not 'Error in call to target'."""
    from framework.config.build import build

    monkeypatch.setenv("FRAMEWORK_TRUST_ALLOW", "tests.helpers.")
    with pytest.raises(ConfigError, match=r"^model: building tests.helpers.failing.needs_a_missing_package needs what "
                                          r"is not installed here: No module named 'no_such_package_for_the_test'\. "
                                          r"Install it, or choose another model\.$"):
        build({"_target_": "tests.helpers.failing.needs_a_missing_package"}, "model")
