"""cluster=xla and the XLA options as seen from an environment without torch_xla (this one): the
host ranks from the TPU VM's variables, strategy=auto's XLA choice, one process per host under
SPMD, and the refusal that says how to get torch_xla. The XLA runs themselves: tests/xla
(`make test-xla`)."""
from __future__ import annotations

import importlib.util

import pytest

from framework.cluster.xla import XLAEnvironment
from framework.errors import ConfigError
from framework.plugins import build_plugins
from framework.preflight import prepare
from tests.conftest import TINY_GPT, compose_cfg
from tests.helpers.in_process import run_command


def test_host_ranks_from_the_tpu_vm_variables(monkeypatch):
    monkeypatch.setenv("TPU_WORKER_ID", "1")
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "host-a,host-b")
    env = XLAEnvironment()
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (2, 1, 0, 1)
    assert env.main_address == "host-a" and env.main_port == 8476 and env.creates_processes_externally
    assert not XLAEnvironment.detect()  # explicit only
    env.validate(devices=4, num_nodes=2)
    with pytest.raises(ConfigError, match="num_nodes=3 with cluster=xla: this XLA slice has 2 hosts"):
        env.validate(devices=4, num_nodes=3)


def test_a_lone_host_is_rank_zero_of_one(monkeypatch):
    monkeypatch.delenv("TPU_WORKER_ID", raising=False)
    monkeypatch.delenv("TPU_WORKER_HOSTNAMES", raising=False)
    env = XLAEnvironment()
    assert (env.world_size(), env.global_rank(), env.main_address) == (1, 0, "localhost")


@pytest.mark.parametrize("devices,strategy", [(1, "single_xla"), (4, "xla_spmd")])
def test_strategy_auto_on_xla_and_one_process_per_host(devices, strategy):
    cfg = compose_cfg([*TINY_GPT, "accelerator=xla", "accelerator.pjrt_device=CPU", f"devices={devices}",
                       "data.batch_size=8"])
    plugins = build_plugins(cfg)
    assert plugins.strategy.name == strategy and plugins.strategy.devices == devices
    prepared = prepare(cfg, strict=False)
    assert prepared.world_size == 1  # SPMD: one process drives every device of the host


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is not None, reason="torch_xla is installed here")
def test_refused_without_torch_xla_saying_how_to_get_it():
    problems = prepare(compose_cfg([*TINY_GPT, "accelerator=xla", "strategy=single_xla"]), strict=False).problems
    assert len(problems) == 1 and problems[0].startswith("accelerator=xla: torch_xla is not installed in this "
                                                         "environment")
    assert "make test-xla builds .venv-xla" in problems[0].replace("`", "")


@pytest.mark.parametrize("overrides,named", [
    (["checkpoint_io=xla"], "checkpoint_io=xla with accelerator=cpu: this plugin serves XLA runs only"),
    (["cluster=xla"], "cluster=xla with accelerator=cpu: this plugin serves XLA runs only"),
    (["checkpoint_io=xla", "cluster=xla"], "checkpoint_io=xla, cluster=xla with accelerator=cpu: these plugins"),
])
def test_xla_plugins_are_refused_without_an_xla_accelerator(tmp_path, overrides, named):
    problems = prepare(compose_cfg([*TINY_GPT, *overrides]), strict=False).problems
    assert len(problems) == 1 and problems[0].startswith(named), problems
    assert "use checkpoint_io=torch" in problems[0]
    result = run_command(["train", *TINY_GPT, *overrides, "name=refused"], tmp_path)
    assert result.returncode == 2 and named in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "outputs" / "refused").exists()
