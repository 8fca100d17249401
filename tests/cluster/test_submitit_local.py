"""hydra/launcher=submitit_local: each job of a sweep runs as a local background process (the
framework starts the job's own processes), and the sweep's jobs share one sweep directory."""
from __future__ import annotations

import json

import pytest

from tests.conftest import TINY_GPT, run_train
from tests.helpers.in_process import run_command

pytestmark = pytest.mark.slow


def test_a_sweep_through_submitit_local(tmp_path):
    args = [*TINY_GPT, "trainer.max_steps=4", "trainer.val_every=2", "logger=[csv]"]
    result = run_train(["-m", "hydra/launcher=submitit_local", *args, "strategy=ddp", "devices=2", "seed=1,2"],
                       tmp_path, timeout=600, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [sweep] = [p.parent for p in (tmp_path / "multirun").rglob("multirun.yaml")]  # one sweep directory
    summaries = [json.loads((sweep / str(i) / "summary.json").read_text()) for i in (0, 1)]
    assert [s["world_size"] for s in summaries] == [2, 2]
    assert summaries[0]["name"] == summaries[1]["name"]  # the name was fixed when the sweep started
    reference = run_command(["train", *args, "strategy=ddp", "devices=2", "seed=2", "name=ref"], tmp_path,
                            env={"OMP_NUM_THREADS": "1"})
    assert reference.returncode == 0, reference.stderr
    assert summaries[1]["objective_value"] == json.loads(
        (tmp_path / "outputs" / "ref" / "summary.json").read_text())["objective_value"]
