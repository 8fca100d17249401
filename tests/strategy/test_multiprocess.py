"""Launch behaviour at 2 processes: only rank zero printing, shared imports, a failing worker, a
user's error inside a worker, refusals before any process (sweeps of multi-process jobs:
tests/test_sweeps.py; the equivalence of the strategies: test_equivalence.py; their resumes:
test_resume_two_ranks.py)."""
from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys

import pytest

from framework.accelerator.cpu import CPUAccelerator
from framework.preflight import prepare
from tests.conftest import DIGITS, ROOT, TINY_GPT, checkpoints, compose_cfg, run_train
from tests.helpers.in_process import run_command

pytestmark = pytest.mark.slow

TOO_MANY = CPUAccelerator().max_processes() + 1  # one process more than this machine's CPU allows
STEPS = 4
# what launching is checked with: a few steps, one checkpoint at the end
BASE = [*TINY_GPT, f"trainer.max_steps={STEPS}", "trainer.log_every=1", "trainer.val_every=2", "model.dropout=0.0",
        "trainer.val_at_start=false", "callbacks=[checkpoint]"]


@pytest.fixture(scope="module")
def ddp_as_typed(tmp_path_factory):
    """`python train.py strategy=ddp devices=2`, each worker recording its shared memory at start."""
    root = tmp_path_factory.mktemp("ddp_as_typed")
    shared = f"+callbacks.shared={{_target_: tests.helpers.shared_pages.SharedPages, out_dir: {root}}}"
    result = run_train(["strategy=ddp", "devices=2", "name=print", *BASE, shared, "trust.allow=[tests.helpers.]"],
                       root, env={"PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    return result, root


def test_only_rank_zero_prints(ddp_as_typed):
    result, root = ddp_as_typed
    assert result.stdout.count(f"step {STEPS} | val/loss") == 1
    assert result.stdout.count("saved checkpoint") == len(checkpoints(root / "outputs" / "print")) == 1


def test_workers_share_the_imports_of_the_process_they_are_forked_from(ddp_as_typed):
    """The forkserver imports torch and the framework once (framework/launch/preload.py); each
    worker shares those pages instead of holding its own copy (~1 MiB shared without it), and its
    garbage collector leaves the objects it inherited alone."""
    _, root = ddp_as_typed
    for rank in (0, 1):
        record = json.loads((root / f"shared_rank{rank}.json").read_text())
        assert record["parent_has_torch"]
        assert record["shared_dirty_kib"] > 100 * 1024, record  # torch alone: ~145 MiB of anonymous memory
        assert record["shared_dirty_kib"] > 0.5 * record["anonymous_kib"], record  # most of it
        assert record["frozen_objects"] > 100_000, record  # the imports' objects: the collector never copies them


def test_a_failing_worker_stops_the_group_and_is_shown_first(tmp_path):
    args = [*DIGITS, "model._target_=tests.helpers.failing.FailOnRank", "+model.rank=1", "strategy=ddp",
            "devices=2", "name=fail", "trainer.max_steps=3", "trust.allow=[tests.helpers.]"]
    result = run_train(args, tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert result.returncode == 1
    assert "worker rank 1 failed first" in result.stderr
    assert "deliberate failure on rank 1" in result.stderr
    assert result.stderr.startswith("error: worker rank 1 failed first")  # the cause, before the consequences
    assert result.stderr.count("Traceback") == 1


def test_a_user_error_inside_a_worker_exits_2(tmp_path):
    # found only once a worker builds its loaders: a batch larger than a rank's share of the data
    result = run_train(["strategy=fsdp", "devices=2", "name=empty", *BASE, "data.batch_size=100000"], tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "the training set gives no batches at this batch size and world size" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("overrides,fragment", [
    (["strategy=deepspeed_stage_2", "precision=64"], "DeepSpeed has no float64 mode"),
    (["strategy=deepspeed_stage_3", "precision=16"], "DeepSpeed refuses fp16"),
    (["strategy=deepspeed_stage_3_offload_nvme"], "NVMe offload needs the libaio library"),
    (["strategy=fairscale_fsdp"], "use strategy=fsdp"),
    (["strategy=deepspeed_stage_2", "trainer.clip_grad_value=1"], "clips by global norm only"),
    (["strategy=deepspeed_stage_2", "precision=bf16_true"], "use precision=bf16"),
    (["strategy=ddp", "num_nodes=2"], "start one process per device on every node"),
    (["strategy=ddp", f"devices={TOO_MANY}"], f"devices={TOO_MANY}: accelerator=cpu has only"),
    (["strategy=ddp", "strategy.sync_batchnorm=true"], "SyncBatchNorm runs on CUDA only"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_compatibility_refusals_before_any_process(tmp_path, overrides, fragment):
    devices = [] if any(o.startswith("devices=") for o in overrides) else ["devices=2"]
    if not _refused_on_this_machine(fragment):
        # this machine can run it (a CPU with fp16 hardware, libaio installed): the same table lets it pass
        prepare(compose_cfg([*overrides, *devices]))
        return
    result = run_command(["train", *overrides, *devices, "name=refused"], tmp_path)  # as typed, in this process
    assert result.returncode == 2 and fragment in result.stderr
    assert not (tmp_path / "outputs" / "refused").exists()


def _refused_on_this_machine(fragment: str) -> bool:
    """Two refusals depend on the machine, read with the predicates the table uses."""
    if "libaio" in fragment:
        return ctypes.util.find_library("aio") is None
    if "fp16" in fragment:
        return not CPUAccelerator().fast_fp16()
    return True


def test_deepspeed_and_fairscale_are_imported_only_when_chosen():
    code = ("import sys; from tests.conftest import compose_cfg; from framework.preflight import prepare; "
            "prepare(compose_cfg(['strategy=ddp', 'devices=2'])); "
            "prepare(compose_cfg(['strategy=deepspeed_stage_3', 'devices=2'])); "
            "print(sorted(m for m in ('deepspeed', 'fairscale', 'tensorboard') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stderr


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed_stage_2"])
def test_the_digits_recipe_under_a_sharding_strategy(tmp_path, strategy):
    """A model without Blocks: fsdp shards only the root unless told otherwise. (Through the
    command's own entry in this process: its workers fork from this process's forkserver.)"""
    result = run_command(["train", "--config-dir", str(ROOT / "recipes"), "--config-name", "digits_classifier",
                          f"strategy={strategy}", "devices=2", "name=recipe", "trainer.max_steps=100"], tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "outputs" / "recipe" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["metrics"]["val/accuracy"] > 0.8
