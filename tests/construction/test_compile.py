"""trainer.compile=true: each unit compiled in place (the whole model where it has none), the same
losses and checkpoint names as without, under the strategies that take it; refused where not."""
from __future__ import annotations

import csv

import pytest
import torch

from framework.construction.compile import compile_units
from framework.construction.units import choose_units
from framework.models.gpt import GPT
from framework.models.mlp import MLP
from tests.conftest import DIGITS, TINY_GPT, checkpoints, load_model_state, run_inprocess

BASE = [*TINY_GPT, "model.n_layer=2", "trainer.max_steps=3", "trainer.log_every=1", "trainer.val_every=3",
        "model.dropout=0.0", "trainer.val_at_start=false", "callbacks=[checkpoint]"]


def _losses(out, key="train/loss") -> list[float]:
    return [float(r[key]) for r in csv.DictReader(open(out / "metrics.csv")) if r.get(key)]


def test_units_are_compiled_in_place_and_names_are_kept(capsys):
    gpt = GPT(n_layer=2, n_embd=32, n_head=2)
    names = list(gpt.state_dict())
    what = compile_units(gpt, choose_units, talk=True)
    assert what == "2 x Block (the model's sharding_units)" and list(gpt.state_dict()) == names
    assert all(block._compiled_call_impl is not None for block in gpt.blocks) and gpt._compiled_call_impl is None
    assert "compile: torch.compile on 2 x Block" in capsys.readouterr().out
    mlp = MLP()
    assert compile_units(mlp, choose_units, talk=False) == "the whole MLP (it has no units)"
    assert mlp._compiled_call_impl is not None


@pytest.mark.slow
@pytest.mark.parametrize("world", [["strategy=single_device"], ["strategy=fsdp", "devices=2"]], ids=["single", "fsdp"])
def test_compiled_blocks_train_like_eager_ones(tmp_path, world, capfd):
    run_inprocess([*BASE, *world, "trainer.compile=true"], tmp_path / "compiled")
    if "devices=2" not in world:  # a worker's output goes where the launcher's server sends it, not to capfd
        said = capfd.readouterr().out
        assert "compile: torch.compile on 2 x Block" in said and "compile: the first forward took" in said
    run_inprocess([*BASE, *world], tmp_path / "eager")
    torch.testing.assert_close(torch.tensor(_losses(tmp_path / "compiled")), torch.tensor(_losses(tmp_path / "eager")),
                               rtol=1e-5, atol=1e-5)
    compiled, eager = (load_model_state(checkpoints(tmp_path / name)[-1]) for name in ("compiled", "eager"))
    assert list(compiled) == list(eager)  # no _orig_mod in the names: checkpoints move to eager runs
    for name, value in eager.items():
        torch.testing.assert_close(compiled[name], value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_a_model_without_units_is_compiled_whole(tmp_path):
    digits = [*DIGITS, "trainer.max_steps=4", "trainer.val_every=4", "callbacks=[]", "trainer.log_every=2"]
    run_inprocess([*digits, "trainer.compile=true"], tmp_path / "compiled")
    run_inprocess(digits, tmp_path / "eager")
    torch.testing.assert_close(torch.tensor(_losses(tmp_path / "compiled")), torch.tensor(_losses(tmp_path / "eager")),
                               rtol=1e-5, atol=1e-5)
