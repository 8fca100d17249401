"""The batch split (framework/batch_split.py): the one place a batch is cut, by the contract its
task states (Task.batch_split); nothing else of the framework names a cut batch's fields or asks a
model whether it is split."""
from __future__ import annotations

import subprocess

import pytest
import torch

from framework.batch_split import (
    SEQUENCE,
    SHIFTED,
    WHOLE_ROWS,
    BatchSplit,
    cut_sequence,
    inputs_and_targets,
    scored_tokens,
)
from framework.errors import ConfigError
from framework.tasks.classification import Classification
from framework.tasks.distillation import Distillation
from framework.tasks.language_modeling import LanguageModeling
from framework.tasks.preference import Preference
from tests.conftest import ROOT


def test_only_the_batch_split_names_a_cut_batch():
    found = subprocess.run(["git", "grep", "-nE", r"shift_labels|sequence_split|hasattr\(.*split", "--", "framework/"],
                           cwd=ROOT, capture_output=True, text=True).stdout.splitlines()
    assert [line for line in found if not line.startswith("framework/batch_split.py:")] == []


def test_each_task_states_its_split():
    assert LanguageModeling.batch_split is SEQUENCE
    for task in (Classification, Preference, Distillation):  # pairs, features, a teacher: whole rows only
        assert task.batch_split is WHOLE_ROWS


def test_a_cut_keeps_each_positions_own_label_and_counts_what_the_whole_batch_scores():
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    labels = torch.tensor([[-100, -100, 7, 8, 9, 10]])  # a prompt not scored
    whole = {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}
    cut = cut_sequence(whole, SEQUENCE, 4)
    assert cut.length == 8 and cut.mask[0].tolist() == [True] * 6 + [False] * 2
    assert cut.fields[SHIFTED][0].tolist() == [-100, 7, 8, 9, 10, -100, -100, -100]
    assert cut.fields["position_ids"][0].tolist() == list(range(8))
    assert scored_tokens(cut.fields) == scored_tokens(whole) == 4
    inputs, targets = inputs_and_targets(cut.fields)
    assert SHIFTED not in inputs and torch.equal(targets, cut.fields[SHIFTED])
    assert torch.equal(inputs_and_targets(whole)[1][:, :6], targets[:, :6])


def test_a_cut_the_task_does_not_allow_is_refused_naming_the_fix():
    with pytest.raises(ConfigError, match=r"batch_split.sequence is false\); set strategy.context_parallel_size=1"):
        cut_sequence({"input_ids": torch.zeros(1, 4, dtype=torch.long)}, WHOLE_ROWS, 2)
    narrow = BatchSplit(sequence=True, per_token=("input_ids",))
    with pytest.raises(ConfigError, match=r"the batch has labels, which the task does not cut .*per_token: input_ids"):
        cut_sequence({"input_ids": torch.zeros(1, 4, dtype=torch.long), "labels": torch.zeros(1, 4)}, narrow, 2)
