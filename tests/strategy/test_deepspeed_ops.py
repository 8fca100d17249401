"""DeepSpeed's op builder on the machines users have: the ops it compiles build from the
TORCH_CUDA_ARCH_LIST a GPU image sets (framework/strategy/deepspeed/arch_list.py)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("deepspeed")


def test_an_arch_list_with_suffixes_is_made_readable_for_deepspeeds_op_builder(monkeypatch):
    """Hopper images set TORCH_CUDA_ARCH_LIST=9.0a; DeepSpeed's builder cannot parse '0a' (measured on
    an H100: FusedAdam never built). The suffix is dropped for its build, once, said."""
    import importlib

    from framework.strategy.deepspeed.arch_list import readable, readable_arch_list

    assert [readable(e) for e in ("9.0a", "10.0a+PTX", "8.6", "12.0f")] == ["9.0", "10.0+PTX", "8.6", "12.0"]
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0a 9.0")
    builder = importlib.import_module("deepspeed.ops.op_builder.fused_adam").FusedAdamBuilder()
    with pytest.raises(ValueError, match="invalid literal for int"):
        builder.compute_capability_args()
    said = readable_arch_list()
    assert "TORCH_CUDA_ARCH_LIST=8.0;9.0a 9.0 has architecture suffixes" in said and "built for 8.0;9.0" in said
    assert builder.compute_capability_args() == ["-gencode=arch=compute_80,code=sm_80",
                                                 "-gencode=arch=compute_90,code=sm_90"]
    assert readable_arch_list() == ""  # nothing left to do: nothing said again


@pytest.mark.slow
def test_zero3s_partitioned_build_takes_the_weights_of_every_other_strategy(tmp_path, monkeypatch):
    """On a GPU zero.Init's build draws from the GPU's generator; the framework then replays the
    initialisers from the CPU's (framework/strategy/deepspeed/cpu_init.py). Here, on the CPU, that
    path is taken on purpose with every partition wiped first: one step at lr=0 must leave exactly
    the weights of a single-device build of the same seed."""
    from framework.strategy.deepspeed import base, cpu_init
    from tests.conftest import TINY_GPT, checkpoints, load_model_state, run_inprocess

    replayed = []

    def wiped_then_replayed(model, factory, rng_state):
        for param in model.parameters():
            param.ds_tensor.zero_()
        replayed.append(cpu_init.initialise_from_cpu(model, factory, rng_state))
        return replayed[-1]

    monkeypatch.setattr(base.DeepSpeedStrategy, "_device_draws_the_init", lambda self: True)
    monkeypatch.setattr(base, "initialise_from_cpu", wiped_then_replayed)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    one_step = [*TINY_GPT, "trainer.max_steps=1", "optimizer.lr=0.0", "trainer.val_at_start=false",
                "callbacks=[checkpoint]", "model.n_layer=2"]
    run_inprocess([*one_step, "strategy=deepspeed_stage_3"], tmp_path / "zero3")
    run_inprocess([*one_step, "strategy=single_device"], tmp_path / "one")
    assert replayed == [""]
    zero3, one = (load_model_state(checkpoints(tmp_path / name)[-1]) for name in ("zero3", "one"))
    assert set(zero3) == set(one) and all(torch.equal(zero3[k], one[k]) for k in one)


@pytest.mark.slow
def test_a_second_zero3_run_in_the_same_process_sets_up_like_the_first(tmp_path, monkeypatch):
    """A Hydra sweep runs its jobs in one process: DeepSpeed's cached clone of the first job's
    world group must not outlive that group (framework/strategy/deepspeed/groups.py), or ZeRO-3's
    set-up of the second job fails with "Group ... is not registered"."""
    from tests.conftest import TINY_GPT, checkpoints, load_model_state, run_inprocess

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    one_step = [*TINY_GPT, "trainer.max_steps=1", "trainer.val_at_start=false", "callbacks=[checkpoint]",
                "model.n_layer=2", "strategy=deepspeed_stage_3"]
    for name in ("first", "second"):
        run_inprocess(one_step, tmp_path / name)
    first, second = (load_model_state(checkpoints(tmp_path / name)[-1]) for name in ("first", "second"))
    assert set(first) == set(second)
    assert all(torch.allclose(first[k], second[k], rtol=0, atol=1e-6) for k in first)


@pytest.mark.slow
def test_zero3s_replayed_build_writes_each_ranks_own_slice_at_two_processes(tmp_path):
    """The replay at 2 processes (torchrun): every rank wipes its partitions and writes back its own
    slice of each parameter (`partition_of`: its rank in the partition group, the last one padded),
    so one step at lr=0 leaves exactly the single-device build of the same seed."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT, TINY_GPT, checkpoints, load_model_state
    from tests.helpers.in_process import run_command

    one_step = [*TINY_GPT, "trainer.max_steps=1", "optimizer.lr=0.0", "trainer.val_at_start=false",
                "callbacks=[checkpoint]", "model.n_layer=2", "model.n_embd=36", "model.n_head=2"]  # 36: odd partitions
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "DS_ACCELERATOR": "cpu"}
    env.pop("HYDRA_FULL_ERROR", None)
    zero3 = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            str(ROOT / "tests" / "helpers" / "zero3_wiped.py"), *one_step,
                            "strategy=deepspeed_stage_3", "devices=2", "name=zero3"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)
    assert zero3.returncode == 0, zero3.stdout[-2000:] + zero3.stderr[-3000:]
    assert [(tmp_path / f"replayed-rank{r}.txt").read_text() for r in (0, 1)] == ["ok", "ok"]
    single = run_command(["train", *one_step, "strategy=single_device", "name=one"], tmp_path)  # in this process
    assert single.returncode == 0, single.stderr[-2000:]
    two, one = (load_model_state(checkpoints(tmp_path / "outputs" / name)[-1]) for name in ("zero3", "one"))
    assert set(two) == set(one) and all(torch.equal(two[k], one[k]) for k in one)
