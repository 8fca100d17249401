"""framework/cgroup.py: the one reader of this process's memory cgroup (OOM report, own memory)."""
from __future__ import annotations

from framework.cgroup import CGROUP_ROOT, memory_groups


def test_memory_groups_of_both_versions(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("12:cpu,cpuacct:/job\n9:memory:/job/worker0\n0::/user.slice/job\n")
    groups = memory_groups(proc)
    assert [(g.version, g.path, g.name) for g in groups] == [
        (1, CGROUP_ROOT / "memory" / "job" / "worker0", "/job/worker0"),
        (2, CGROUP_ROOT / "user.slice" / "job", "/user.slice/job")]


def test_no_memory_group_where_proc_says_nothing(tmp_path):
    assert memory_groups(tmp_path / "missing") == []
    (tmp_path / "cgroup").write_text("3:cpu:/x\n")
    assert memory_groups(tmp_path / "cgroup") == []
