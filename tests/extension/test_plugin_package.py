"""The example plugin package (examples/plugin), pip-installed as a user would: its options are
found through entry points, listed with their package, trusted, and each trains by one override;
its classes pass the framework's contract suites."""
from __future__ import annotations

import csv
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import framework.testing as contract
from tests.cli.helpers import framework_cmd
from tests.conftest import ROOT, TINY_GPT, run_train
from tests.helpers.run_cache import trained_run

ARGS = [*TINY_GPT, "trainer.max_steps=4", "trainer.val_every=4", "trainer.log_every=1"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """`pip install examples/plugin` into a folder of its own (the main environment stays clean)."""
    target = tmp_path_factory.mktemp("plugin") / "site"
    result = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                             "--target", str(target), str(ROOT / "examples" / "plugin")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return target


@pytest.fixture
def on_path(site, monkeypatch):
    monkeypatch.syspath_prepend(str(site))
    return {"PYTHONPATH": str(site)}


def losses(run_dir: Path) -> list[tuple[str, str]]:
    with open(run_dir / "metrics.csv") as f:
        return [(r["step"], r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")]


@pytest.mark.slow  # a fresh interpreter preparing every option of three groups
def test_list_shows_the_plugin_options_with_their_package(on_path, tmp_path):
    # a fresh interpreter: the installed packages' entry points are read once per process
    result = framework_cmd("list", "strategy", "checkpoint_io", "cluster", cwd=tmp_path, env=on_path, in_process=False)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for name in ("hooked_ddp", "hooked_ddp_one_mb_buckets", "bucket", "mysched"):
        at = next(i for i, line in enumerate(lines) if line.strip().startswith(name + " "))
        # on failure, the line after it too: the reason the option is not usable here
        assert " yes " in lines[at] and "[from framework-plugin-example]" in lines[at], "\n".join(lines[at:at + 2])


def test_the_plugin_classes_pass_the_contract_suites(on_path):
    from framework_plugin_example.checkpoint_io import BucketCheckpointIO
    from framework_plugin_example.cluster import MySchedEnvironment
    from framework_plugin_example.strategy import HookedDDPStrategy

    contract.check_strategy(HookedDDPStrategy, report_buckets=False)
    contract.check_checkpoint_io(BucketCheckpointIO(url="memory://contract"))
    contract.check_cluster_environment(MySchedEnvironment, {"MYSCHED_RANK": "1", "MYSCHED_WORLD": "2",
                                                            "MYSCHED_LOCAL_RANK": "1", "MYSCHED_NODE": "0",
                                                            "MYSCHED_MAIN": "10.0.0.1:29400"}, devices=2, num_nodes=1)


def test_the_bucket_reads_back_a_file_missing_locally(on_path, tmp_path, monkeypatch):
    import torch
    from framework_plugin_example.checkpoint_io import BucketCheckpointIO

    monkeypatch.chdir(tmp_path)
    io = BucketCheckpointIO(url="memory://readback")
    path = tmp_path / "run" / "checkpoints" / ".partial-step_000002" / "model.pt"
    io.save({"w": torch.arange(4.0)}, path)
    final = tmp_path / "run" / "checkpoints" / "step_000002" / "model.pt"  # where the mirror stored it
    assert io.remote_path(path) == io.remote_path(final) == "memory://readback/run/checkpoints/step_000002/model.pt"
    assert torch.equal(io.load(final)["w"], torch.arange(4.0)) and final.is_file()


@pytest.mark.slow
def test_custom_strategy_trains_like_ddp_and_registered_defaults_apply(on_path, tmp_path):
    ddp = trained_run(["strategy=ddp", "devices=2", *ARGS])
    hooked = run_train(["name=hooked", "strategy=hooked_ddp", "devices=2", *ARGS], tmp_path, env=on_path)
    assert hooked.returncode == 0, hooked.stderr[-3000:]
    assert losses(tmp_path / "outputs" / "hooked") == losses(ddp)  # the same averaging
    assert "hooked_ddp: reduced 4 gradient bucket(s)" in hooked.stdout  # one bucket per step for this model
    registered = run_train(["name=small", "strategy=hooked_ddp_one_mb_buckets", "devices=2", *ARGS,
                            "strategy.report_buckets=false"], tmp_path, env=on_path)
    assert registered.returncode == 0, registered.stderr[-3000:]
    from omegaconf import OmegaConf

    config = OmegaConf.load(tmp_path / "outputs" / "small" / "config.yaml")
    assert config.strategy.bucket_cap_mb == 1.0 and config.strategy._target_.endswith("HookedDDPStrategy")
    assert losses(tmp_path / "outputs" / "small") == losses(ddp)
    without = run_train(["name=gone", "strategy=hooked_ddp", *ARGS], tmp_path)  # plugin not installed here
    assert without.returncode == 2 and "strategy=hooked_ddp: no such option" in without.stderr


@pytest.mark.slow
def test_bucket_checkpoint_io_mirrors_every_checkpoint_file(on_path, tmp_path):
    bucket = tmp_path / "bucket"
    result = run_train(["name=mirrored", "checkpoint_io=bucket", f"checkpoint_io.url=file://{bucket}", *ARGS],
                       tmp_path, env=on_path)
    assert result.returncode == 0, result.stderr[-3000:]
    local = tmp_path / "outputs" / "mirrored" / "checkpoints" / "step_000004"
    mirrored = bucket / "outputs" / "mirrored" / "checkpoints" / "step_000004"
    for name in ("model.pt", "optimizer.pt", "loop_rank0.pt"):
        assert (mirrored / name).read_bytes() == (local / name).read_bytes(), name


@pytest.mark.slow
def test_custom_cluster_environment_joins_processes_it_did_not_start(on_path, tmp_path):
    """Two processes started by hand with MYSCHED_* variables train exactly like the framework's
    own launcher."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = ["name=mysched", "cluster=mysched", "strategy=ddp", "devices=2", *ARGS]
    processes = []
    for rank in range(2):
        env = {**os.environ, **on_path, "OMP_NUM_THREADS": "1", "MYSCHED_RANK": str(rank), "MYSCHED_WORLD": "2",
               "MYSCHED_LOCAL_RANK": str(rank), "MYSCHED_NODE": "0", "MYSCHED_MAIN": f"127.0.0.1:{port}"}
        processes.append(subprocess.Popen([sys.executable, str(ROOT / "train.py"), *common], cwd=tmp_path, env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=600) for p in processes]
    assert all(p.returncode == 0 for p in processes), outputs[0][1][-2000:] + outputs[1][1][-2000:]
    assert losses(tmp_path / "outputs" / "mysched") == losses(trained_run(["strategy=ddp", "devices=2", *ARGS]))
