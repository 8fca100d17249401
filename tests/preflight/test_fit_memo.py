"""The meta-device forwards of a preparation (framework/preflight/components.py) run once per process
for the same model, adapter, task, data, batch and device: one recipe under every strategy, or a
sweep's jobs, share them; anything they depend on changed runs them again, with the same verdicts."""
from __future__ import annotations

import pytest

from framework.errors import ConfigError
from framework.preflight import components, prepare
from tests.conftest import DIGITS, TINY_GPT, compose_cfg


@pytest.fixture
def forwards(monkeypatch):
    """Counts check_fit's runs; the memo starts empty."""
    monkeypatch.setattr(components, "_FITTED", {})
    calls = []
    real = components.check_fit
    monkeypatch.setattr(components, "check_fit", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_the_same_model_data_and_task_are_tried_once_whatever_the_strategy(forwards):
    first = prepare(compose_cfg([*TINY_GPT, "strategy=ddp", "devices=2"]))
    again = prepare(compose_cfg([*TINY_GPT, "strategy=fsdp", "devices=2", "optimizer.lr=0.01"]))
    assert len(forwards) == 1
    assert again.activation_bytes == first.activation_bytes > 0 and again.logged == first.logged
    prepare(compose_cfg([*TINY_GPT, "data.batch_size=4"]))  # another batch: tried again
    prepare(compose_cfg([*TINY_GPT, "model.n_embd=64"]))  # another model
    prepare(compose_cfg(DIGITS))  # another task and data
    assert len(forwards) == 4


def test_a_misfit_is_refused_every_time(forwards):
    wrong = [*DIGITS, "model=gpt"]  # data and task fit each other, not the model
    for _ in range(2):
        with pytest.raises(ConfigError, match="do not fit together"):
            prepare(compose_cfg(wrong))
    assert len(forwards) == 2
