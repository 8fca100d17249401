"""strategy=deepspeed_stage_3_offload_nvme run for real: ZeRO-3 swapping parameters and optimizer
state through libaio into a local folder gives deepspeed_stage_3's losses. libaio is installed
where the machine allows it (tests/helpers/libaio.py); DeepSpeed compiles its async_io op the first
time (minutes; cached under ~/.cache/torch_extensions)."""
from __future__ import annotations

import csv

import pytest

from framework.strategy.deepspeed_stage_3_offload_nvme import DeepSpeedStage3OffloadNvmeStrategy
from tests.conftest import TINY_GPT, run_train
from tests.helpers.libaio import ensure_libaio


def _train_losses(run) -> list[float]:
    return [float(r["train/loss"]) for r in csv.DictReader(open(run / "metrics.csv")) if r.get("train/loss")]


@pytest.mark.slow
def test_nvme_offload_trains_like_zero3_in_memory(tmp_path):
    reason = ensure_libaio()
    if reason:
        pytest.skip(reason)
    swap = tmp_path / "nvme"
    args = [*TINY_GPT, "devices=2", "trainer.max_steps=4", "trainer.log_every=1", "trainer.val_every=4"]
    nvme = run_train([*args, "strategy=deepspeed_stage_3_offload_nvme", f"strategy.nvme_path={swap}", "name=nvme"],
                     tmp_path, timeout=900)
    assert nvme.returncode == 0, nvme.stderr[-3000:]
    memory = run_train([*args, "strategy=deepspeed_stage_3", "name=memory"], tmp_path)
    assert memory.returncode == 0, memory.stderr[-3000:]
    # each rank swapped its parameters and optimizer state there (DeepSpeed deletes the files at the end)
    assert {str(p.relative_to(swap)) for p in swap.glob("zero_stage_3/*/rank*")} == {
        f"zero_stage_3/{kind}/rank{r}" for kind in ("optimizer", "float32params") for r in (0, 1)}
    a, b = _train_losses(tmp_path / "outputs" / "nvme"), _train_losses(tmp_path / "outputs" / "memory")
    assert len(a) == 4 and a == pytest.approx(b, abs=1e-6)


def test_an_unwritable_nvme_path_is_refused_before_launch(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    problems = DeepSpeedStage3OffloadNvmeStrategy(nvme_path=str(blocker / "swap")).problems(None)
    assert problems == [f"strategy.nvme_path={blocker / 'swap'}: cannot be created ({blocker} is not writable); set "
                        "strategy.nvme_path to a folder on a fast local disk (e.g. strategy.nvme_path=/tmp/nvme)."]
    assert DeepSpeedStage3OffloadNvmeStrategy(nvme_path=str(tmp_path / "new" / "swap")).problems(None) == []
