"""The batch contract between data and task (framework/data/batch_kinds.py): every shipped data
option says what its batches are, every shipped task what it reads, each task has a shipped data
option it reads, and a pairing outside the contract is refused naming the options that fit."""
from __future__ import annotations

import importlib

import pytest
import yaml

from framework.data.batch_kinds import KINDS, check_batches, data_options_giving
from framework.errors import ConfigError
from tests.conftest import ROOT


def _classes(group: str) -> dict[str, type]:
    found = {}
    for path in sorted((ROOT / "conf" / group).glob("*.yaml")):
        module, _, name = yaml.safe_load(path.read_text())["_target_"].rpartition(".")
        found[path.stem] = getattr(importlib.import_module(module), name)
    return found


def test_every_shipped_data_option_and_task_states_its_batches():
    data, tasks = _classes("data"), _classes("task")
    assert {name: cls.batch_kind for name, cls in data.items()} == {
        "chat_files": "tokens", "digits": "features", "gaussian_ring": "points", "preference_files": "pairs",
        "stdlib_text": "token_blocks", "text_files": "tokens", "prompt_files": "prompts"}
    for name, cls in tasks.items():
        assert cls.takes_batches and set(cls.takes_batches) <= set(KINDS), name
        assert data_options_giving(cls.takes_batches), name  # a shipped data option it reads


@pytest.mark.parametrize("task_name", ["classification", "distillation", "gan", "grpo", "language_modeling",
                                       "preference"])
def test_a_pairing_outside_the_contract_is_refused_and_one_inside_passes(task_name):
    task_cls = _classes("task")[task_name]
    for data_cls in _classes("data").values():
        task, data = object.__new__(task_cls), object.__new__(data_cls)
        if data_cls.batch_kind in task_cls.takes_batches:
            check_batches(task, data)
        else:
            with pytest.raises(ConfigError, match=r"Choose data=\w+"):
                check_batches(task, data)


def test_a_class_that_says_nothing_is_left_to_the_example_step():
    class Mine:  # a user's data module or task without the attributes
        pass

    check_batches(Mine(), object.__new__(_classes("data")["digits"]))
    check_batches(object.__new__(_classes("task")["preference"]), Mine())
