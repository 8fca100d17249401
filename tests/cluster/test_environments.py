"""Each cluster environment's parsing and validation, with the edge cases of real schedulers."""
from __future__ import annotations

import os
import socket
import stat

import pytest

from framework.cluster.auto import auto_cluster
from framework.cluster.kubeflow import KubeflowEnvironment
from framework.cluster.local import LocalEnvironment
from framework.cluster.lsf import LSFEnvironment
from framework.cluster.mpi import MPIEnvironment
from framework.cluster.slurm import SLURMEnvironment, _tasks_per_node, expand_nodelist
from framework.cluster.torchelastic import TorchElasticEnvironment
from framework.config import resolvers
from framework.errors import ConfigError

PREFIXES = ("SLURM_", "LSB_", "JSM_", "OMPI_", "PMI_", "PMIX_", "MV2_", "TORCHELASTIC_", "KUBERNETES_")
PLAIN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR",
         "MASTER_PORT")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith(PREFIXES) or key in PLAIN:
            monkeypatch.delenv(key)
    resolvers.job_name.cache_clear()
    yield
    resolvers.job_name.cache_clear()


def setenv(monkeypatch, **values):
    for key, value in values.items():
        monkeypatch.setenv(key, str(value))


# ---- SLURM ---------------------------------------------------------------------------------
@pytest.mark.parametrize("nodelist,hosts", [
    ("n1", ["n1"]),
    ("n[1-3,5]", ["n1", "n2", "n3", "n5"]),
    ("a[01-02],b3", ["a01", "a02", "b3"]),
    ("node[009-011]", ["node009", "node010", "node011"]),
    ("rack[1-2]-gpu[01-02]", ["rack1-gpu01", "rack1-gpu02", "rack2-gpu01", "rack2-gpu02"]),
    ("host-a,host-b", ["host-a", "host-b"]),
    ("c[1,3-4]x,d", ["c1x", "c3x", "c4x", "d"]),
])
def test_slurm_nodelist_forms(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


def test_slurm_nodelist_with_unbalanced_brackets_is_refused():
    with pytest.raises(ConfigError, match="unbalanced brackets"):
        expand_nodelist("n[1-2")


def test_slurm_tasks_per_node_format():
    assert _tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert _tasks_per_node("4") == [4]


def srun_task(monkeypatch, rank=1, ntasks=4, nodes=2, per_node="2(x2)", local=1, node=0, job="4242"):
    setenv(monkeypatch, SLURM_NTASKS=ntasks, SLURM_PROCID=rank, SLURM_LOCALID=local, SLURM_NODEID=node,
           SLURM_NNODES=nodes, SLURM_TASKS_PER_NODE=per_node, SLURM_JOB_ID=job, SLURM_STEP_ID=0,
           SLURM_JOB_NODELIST="gpu[007-008]", SLURM_JOB_NAME="train")


def test_slurm_task_reports_its_place(monkeypatch):
    srun_task(monkeypatch)
    env = auto_cluster()
    assert isinstance(env, SLURMEnvironment) and env.creates_processes_externally
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (4, 1, 1, 0)
    assert env.main_address == "gpu007"
    assert env.main_port == 15000 + 4242
    env.validate(devices=2, num_nodes=2)
    monkeypatch.setenv("MASTER_PORT", "29999")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    assert (env.main_address, env.main_port) == ("10.0.0.1", 29999)


def test_slurm_port_is_the_same_for_every_task_and_differs_between_jobs(monkeypatch):
    srun_task(monkeypatch, job="1001")
    first = SLURMEnvironment().main_port
    srun_task(monkeypatch, rank=3, job="1001")
    assert SLURMEnvironment().main_port == first
    srun_task(monkeypatch, job="1002")
    assert SLURMEnvironment().main_port != first


def test_slurm_array_job(monkeypatch):
    srun_task(monkeypatch, job="77")
    setenv(monkeypatch, SLURM_ARRAY_JOB_ID=70, SLURM_ARRAY_TASK_ID=7)
    assert SLURMEnvironment().job_id == "70_7"
    assert resolvers.job_name() == "slurm-70_7"


@pytest.mark.parametrize("job_name", ["bash", "interactive"])
def test_slurm_interactive_allocation_is_ignored(monkeypatch, job_name):
    srun_task(monkeypatch)
    monkeypatch.setenv("SLURM_JOB_NAME", job_name)
    assert not SLURMEnvironment.detect()
    assert isinstance(auto_cluster(), LocalEnvironment)
    assert resolvers.job_name() != "slurm-4242"


def test_slurm_batch_script_without_srun_lets_the_framework_start_processes(monkeypatch):
    setenv(monkeypatch, SLURM_NTASKS=1, SLURM_JOB_ID=5, SLURM_JOB_NAME="train", SLURM_NNODES=1, SLURM_PROCID=0)
    env = SLURMEnvironment()
    assert not env.creates_processes_externally
    env.validate(devices=2, num_nodes=1)  # the framework will start the 2 processes itself


@pytest.mark.parametrize("devices,num_nodes,message", [
    (1, 2, r"devices=1, but SLURM starts 2\(x2\) task\(s\) per node .*set devices=2, or srun --ntasks-per-node=1"),
    (2, 1, r"num_nodes=1, but this SLURM job step runs on 2 node\(s\) .*set num_nodes=2"),
])
def test_slurm_mismatch_names_the_fix(monkeypatch, devices, num_nodes, message):
    srun_task(monkeypatch)
    with pytest.raises(ConfigError, match=message):
        SLURMEnvironment().validate(devices, num_nodes)


def test_slurm_ntasks_mismatch(monkeypatch):
    srun_task(monkeypatch, ntasks=3, per_node="2,1")
    monkeypatch.delenv("SLURM_TASKS_PER_NODE")
    with pytest.raises(ConfigError, match=r"SLURM started 3 task\(s\) \(SLURM_NTASKS\): srun --ntasks=4"):
        SLURMEnvironment().validate(2, 2)


def test_slurm_requeue_calls_scontrol(monkeypatch, tmp_path):
    srun_task(monkeypatch, job="31337")
    fake = tmp_path / "scontrol"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    env = SLURMEnvironment()
    assert env.preemption_signals() == ["SIGUSR1"]
    assert not env.requeued
    said = []
    env.on_preempted(said.append)
    assert env.requeued and said == ["requeueing SLURM job 31337: SLURM stops this step now and starts the job "
                                     "again, which continues from this checkpoint by itself"]
    assert (tmp_path / "args").read_text().split() == ["requeue", "31337"]
    fake.write_text("#!/bin/sh\necho 'Invalid job id specified' >&2\nexit 1\n")  # said before, failed after
    failed, said = SLURMEnvironment(), []
    failed.on_preempted(said.append)
    assert not failed.requeued and said[1] == "`scontrol requeue 31337` failed: Invalid job id specified"
    quiet = []
    SLURMEnvironment(auto_requeue=False).on_preempted(quiet.append)
    assert quiet == []
    assert not env.restarted
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert env.restarted


def test_slurm_bad_requeue_signal():
    with pytest.raises(ConfigError, match="requeue_signal=SIGNOPE"):
        SLURMEnvironment(requeue_signal="SIGNOPE")


# ---- torchelastic --------------------------------------------------------------------------
def torchrun_process(monkeypatch, rank=2, world=4, local=0, per_node=2, group=1):
    setenv(monkeypatch, TORCHELASTIC_RUN_ID="abc", RANK=rank, WORLD_SIZE=world, LOCAL_RANK=local,
           LOCAL_WORLD_SIZE=per_node, GROUP_RANK=group, MASTER_ADDR="10.1.1.1", MASTER_PORT=29400)


def test_torchelastic_reports_its_place_and_wins_over_slurm(monkeypatch):
    srun_task(monkeypatch)
    torchrun_process(monkeypatch)
    env = auto_cluster()
    assert isinstance(env, TorchElasticEnvironment) and env.creates_processes_externally
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (4, 2, 0, 1)
    assert (env.main_address, env.main_port) == ("10.1.1.1", 29400)
    env.validate(devices=2, num_nodes=2)
    assert resolvers.job_name() == "slurm-4242"  # the job's id names the run before torchrun's


@pytest.mark.parametrize("devices,num_nodes,message", [
    (1, 4, r"devices=1, but torchrun starts 2 process\(es\) per node \(--nproc-per-node=2\): set devices=2"),
    (2, 1, r"num_nodes=1, but torchrun's world is 4 process\(es\), 2 per node, so 2 node\(s\): set num_nodes=2"),
])
def test_torchelastic_mismatch(monkeypatch, devices, num_nodes, message):
    torchrun_process(monkeypatch)
    with pytest.raises(ConfigError, match=message):
        TorchElasticEnvironment().validate(devices, num_nodes)


def test_torchelastic_chosen_outside_torchrun(monkeypatch):
    with pytest.raises(ConfigError, match="start the run with torchrun"):
        TorchElasticEnvironment().validate(1, 1)


def test_torchrun_run_id_names_the_run(monkeypatch):
    torchrun_process(monkeypatch)
    assert resolvers.job_name() == "torchrun-abc"


# ---- Kubeflow ------------------------------------------------------------------------------
def pod(monkeypatch, rank=1, world=3):
    setenv(monkeypatch, MASTER_ADDR="job-master-0", MASTER_PORT=23456, WORLD_SIZE=world, RANK=rank,
           KUBERNETES_PORT="tcp://10.0.0.1:443")


def test_kubeflow_is_explicit_only(monkeypatch):
    pod(monkeypatch)
    assert isinstance(auto_cluster(), LocalEnvironment)
    env = KubeflowEnvironment()
    assert KubeflowEnvironment.detect() and env.creates_processes_externally
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (3, 1, 0, 1)
    assert (env.main_address, env.main_port) == ("job-master-0", 23456)
    env.validate(devices=1, num_nodes=3)


def test_kubeflow_mismatch(monkeypatch):
    pod(monkeypatch)
    with pytest.raises(ConfigError, match="one process per pod; set devices=1"):
        KubeflowEnvironment().validate(2, 3)
    with pytest.raises(ConfigError, match=r"has 3 pod\(s\) \(WORLD_SIZE\): set num_nodes=3"):
        KubeflowEnvironment().validate(1, 2)
    monkeypatch.delenv("MASTER_ADDR")
    with pytest.raises(ConfigError, match="MASTER_ADDR is not set"):
        KubeflowEnvironment().validate(1, 3)


# ---- LSF -----------------------------------------------------------------------------------
def lsf_task(monkeypatch, tmp_path, rank=3, local=1, size=4, hosts=("batch1", "c1", "c1", "c2", "c2")):
    rankfile = tmp_path / "rankfile"
    rankfile.write_text("\n".join(hosts) + "\n")
    setenv(monkeypatch, LSB_JOBID=123456, LSB_DJOB_RANKFILE=rankfile, JSM_NAMESPACE_SIZE=size,
           JSM_NAMESPACE_RANK=rank, JSM_NAMESPACE_LOCAL_RANK=local)


def test_lsf_reports_its_place(monkeypatch, tmp_path):
    lsf_task(monkeypatch, tmp_path)
    monkeypatch.setattr(socket, "gethostname", lambda: "c2.cluster.example")
    env = auto_cluster()
    assert isinstance(env, LSFEnvironment) and env.creates_processes_externally
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (4, 3, 1, 1)
    assert env.main_address == "c1"  # the launch node (first line) runs no task
    assert env.main_port == 10000 + 123456 % 10000
    env.validate(devices=2, num_nodes=2)
    assert resolvers.job_name() == "lsf-123456"


def test_lsf_mismatch_and_unknown_host(monkeypatch, tmp_path):
    lsf_task(monkeypatch, tmp_path)
    with pytest.raises(ConfigError, match=r"LSF job has 2 compute host\(s\) .*set num_nodes=2"):
        LSFEnvironment().validate(4, 1)
    with pytest.raises(ConfigError, match=r"jsrun started 4 \(JSM_NAMESPACE_SIZE\): set devices=2"):
        LSFEnvironment().validate(1, 2)
    monkeypatch.setattr(socket, "gethostname", lambda: "elsewhere")
    with pytest.raises(ConfigError, match=r"this host \(elsewhere\) is not among the compute hosts"):
        LSFEnvironment().node_rank()


def test_lsf_unreadable_rankfile(monkeypatch, tmp_path):
    lsf_task(monkeypatch, tmp_path)
    monkeypatch.setenv("LSB_DJOB_RANKFILE", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="cannot be read"):
        _ = LSFEnvironment().main_address


# ---- MPI -----------------------------------------------------------------------------------
def test_mpi_is_detected_by_its_launcher_variables_without_importing_mpi4py(monkeypatch):
    import sys

    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    assert isinstance(auto_cluster(), MPIEnvironment)
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # as if mpi4py were not installed
    with pytest.raises(ConfigError, match="cluster=mpi needs mpi4py: pip install mpi4py"):
        MPIEnvironment().world_size()


def test_auto_order(monkeypatch, tmp_path):
    assert isinstance(auto_cluster(), LocalEnvironment)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    assert isinstance(auto_cluster(), MPIEnvironment)
    lsf_task(monkeypatch, tmp_path)
    assert isinstance(auto_cluster(), LSFEnvironment)
    srun_task(monkeypatch)
    assert isinstance(auto_cluster(), SLURMEnvironment)
    torchrun_process(monkeypatch)
    assert isinstance(auto_cluster(), TorchElasticEnvironment)


def test_default_run_name_is_the_start_time(monkeypatch):
    import re

    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}/\d{2}-\d{2}-\d{2}", resolvers.job_name())
