"""One format for every strategy: a checkpoint saved by any strategy at 1 or 2 processes loads
into any other at 1 or 2, with the weights and the optimizer state exactly as saved, whether it
was written whole by rank zero (checkpoint_io=torch) or in shards by every rank (checkpoint_io=dcp)."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import TINY_GPT, checkpoints, load_model_state, load_optimizer_state, run_inprocess

pytestmark = pytest.mark.slow

BASE = [*TINY_GPT, "model.dropout=0.0", "trainer.val_at_start=false", "trainer.val_every=100",
        "trainer.val_batches=1", "logger=null"]
SAVERS = [("single_device", 1, "torch"), ("ddp", 2, "torch"), ("fsdp", 2, "torch"), ("deepspeed_stage_1", 2, "torch"),
          ("deepspeed_stage_2", 2, "torch"), ("deepspeed_stage_3", 2, "torch"), ("ddp_sharded", 2, "torch"),
          ("fsdp", 2, "dcp"), ("ddp", 2, "dcp"), ("deepspeed_stage_3", 2, "dcp")]
LOADERS = [("single_device", 1), ("ddp", 2), ("fsdp", 2), ("fsdp", 1), ("deepspeed_stage_2", 2),
           ("deepspeed_stage_3", 2), ("deepspeed_stage_3", 1), ("ddp_sharded", 2)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each saver trains 2 steps (AdamW state exists) and writes its checkpoint."""
    root = tmp_path_factory.mktemp("savers")
    out = {}
    for strategy, devices, io in SAVERS:
        run_dir = root / f"{strategy}_{devices}_{io}"
        run_inprocess([*BASE, f"strategy={strategy}", f"devices={devices}", f"checkpoint_io={io}",
                       "trainer.max_steps=2", "callbacks=[checkpoint]"], run_dir)
        out[(strategy, devices, io)] = checkpoints(run_dir)[-1]
    return out


def _optimizer_tensors(state: dict) -> dict:
    return {(name, key): (value.float() if torch.is_tensor(value) else torch.tensor(float(value)))
            for name, entry in state["state"].items() for key, value in entry.items()}


@pytest.mark.parametrize("loader", LOADERS, ids=[f"{s}@{d}" for s, d in LOADERS])
def test_every_checkpoint_loads_exactly(tmp_path, saved, loader, monkeypatch):
    monkeypatch.setenv("FRAMEWORK_TRUST_ALLOW", "tests.helpers.")  # the state dumper is test code
    strategy, devices = loader
    names = list(saved)
    dump = tmp_path / "dump"
    run_inprocess([*BASE, f"strategy={strategy}", f"devices={devices}", "trainer.max_steps=1", "callbacks=[]",
                   "+callbacks.dump._target_=tests.helpers.dump.DumpRestoredState",
                   f"+callbacks.dump.checkpoints=[{','.join(str(saved[n]) for n in names)}]",
                   f"+callbacks.dump.out_dir={dump}"], tmp_path / "run")
    for i, name in enumerate(names):
        got = torch.load(dump / f"{i}.pt", weights_only=True)
        assert got["step"] == 2
        want_model = load_model_state(saved[name])
        assert set(got["model"]) == set(want_model), name
        for key, value in want_model.items():
            assert torch.equal(got["model"][key].float(), value.float()), f"{name} -> {loader}: {key}"
        want_opt = _optimizer_tensors(load_optimizer_state(saved[name]))
        got_opt = _optimizer_tensors(got["optimizer"])
        assert set(got_opt) == set(want_opt), f"{name} -> {loader}: optimizer keys differ"
        for key, value in want_opt.items():
            assert torch.equal(got_opt[key], value), f"{name} -> {loader}: optimizer {key}"
