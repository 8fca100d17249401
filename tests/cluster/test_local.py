from framework.cluster.auto import auto_cluster
from framework.cluster.local import LocalEnvironment


def test_lone_process(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "NODE_RANK"):
        monkeypatch.delenv(var, raising=False)
    env = LocalEnvironment()
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (1, 0, 0, 0)
    assert (env.main_address, env.main_port) == ("127.0.0.1", 0)
    assert not env.creates_processes_externally


def test_worker_variables(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("GROUP_RANK", "1")
    monkeypatch.setenv("MASTER_PORT", "29511")
    env = LocalEnvironment()
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank(), env.main_port) == (4, 3, 1, 1, 29511)


def test_auto_is_local_here(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert isinstance(auto_cluster(), LocalEnvironment)
