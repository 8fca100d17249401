"""A dimension is declared once (framework/strategy/mesh/dimension.py): a sixth one, which does
nothing (its ranks compute the same batches and hold the same model: "mirrored"), added to a copy
of the source tree as one new file and one entry in DIMENSIONS, resolves, is named in the mesh line
of `framework plan`, is a key of every preset of the mesh strategy, and trains: two mirrored ranks
log the losses one rank does. Nothing else of the tree changes."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY_GPT, metric_values

pytestmark = pytest.mark.slow

#: the one new file: the dimension's descriptor and its resolve step
MIRROR_FILE = '''"""A do-nothing dimension: its ranks compute the same batches with the same whole model."""
from framework.strategy.mesh.dimension import Dimension


def _mirror(given, taking):
    taking.take_first("mirror", "strategy.mirror_parallel_size", given.mirror)


MIRROR = Dimension("mirror", _mirror, data="same", mesh_position=3.5, key="mirror_parallel_size",
                   describe=lambda d: f"{d.mirror} mirrored" if d.mirror > 1 else None,
                   help="ranks that compute the same batches with the same model")
'''
#: the one entry (and its import) in the registry
REGISTRY = "DIMENSIONS: tuple[Dimension, ...] = ("
ENTRY = ("from framework.strategy.mesh.mirror import MIRROR  # noqa: E402\n"
         "DIMENSIONS: tuple[Dimension, ...] = (MIRROR, ")
RUN = [*TINY_GPT, "trainer.max_steps=4", "trainer.log_every=1", "seed=3"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of the project with the sixth dimension: one new file and one entry."""
    root = tmp_path_factory.mktemp("sixth") / "project"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in ("framework", "conf", "hydra_plugins"):
        shutil.copytree(ROOT / part, root / part, ignore=ignore)
    shutil.copy(ROOT / "train.py", root / "train.py")
    (root / "framework" / "strategy" / "mesh" / "mirror.py").write_text(MIRROR_FILE)  # the one new file
    dims = root / "framework/strategy/mesh/dims.py"
    text = dims.read_text()
    assert text.count(REGISTRY) == 1
    dims.write_text(text.replace(REGISTRY, ENTRY))
    return root


def _run(tree: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
    result = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def test_the_new_dimension_resolves_and_refuses_in_the_one_form(monkeypatch):
    """In this process: the new file's descriptor put first in DIMENSIONS (its one entry)."""
    from framework.errors import ConfigError
    from framework.strategy.mesh import dims

    file: dict = {}
    exec(compile(MIRROR_FILE, "mirror.py", "exec"), file)
    monkeypatch.setattr(dims, "DIMENSIONS", (file["MIRROR"], *dims.DIMENSIONS))
    d = dims.DimsSettings(mirror=2, tensor=2).resolve(8, 4)
    assert (d.mirror, d.tensor, d.shard, d.world_size, d.data_parallel) == (2, 2, 2, 8, 2)
    assert d.describe() == "2 data-parallel x 2 mirrored x 2 tensor-parallel ranks"
    # a mirrored rank (coordinate 1) does not report; the next shard is rank 4
    assert (d.data_share(0).reports, d.data_share(2).reports, d.data_share(4).rank) == (True, False, 1)
    with pytest.raises(ConfigError, match=r"^strategy.mirror_parallel_size=3 does not divide the 8 ranks \(devices x "
                       r"num_nodes\); choose a size that divides them.$"):
        dims.DimsSettings(mirror=3).resolve(8, 4)


def test_the_new_dimension_is_a_key_named_in_the_mesh_line(tree, tmp_path):
    out = _run(tree, "-m", "framework", "plan", "strategy=fsdp", "devices=2", "+strategy.mirror_parallel_size=2",
               *TINY_GPT, cwd=tmp_path).stdout
    assert "  mesh: 1 data-parallel x 2 mirrored ranks" in out, out
    bad = subprocess.run([sys.executable, "-m", "framework", "plan", "strategy=fsdp", "devices=2",
                          "+strategy.mirror_parallel_size=0"], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tree)}, timeout=300)
    assert bad.returncode == 2 and "strategy.mirror_parallel_size=0" in bad.stdout + bad.stderr


def test_the_new_dimension_trains_as_one_rank_does(tree, tmp_path):
    _run(tree, str(tree / "train.py"), "strategy=fsdp", "devices=2", "+strategy.mirror_parallel_size=2", *RUN,
         "hydra.run.dir=mirrored", cwd=tmp_path)
    _run(tree, str(tree / "train.py"), "strategy=fsdp", "devices=1", *RUN, "hydra.run.dir=one", cwd=tmp_path)
    mirrored, one = metric_values(tmp_path / "mirrored"), metric_values(tmp_path / "one")
    assert len(one) == 4 and one[-1] < one[0]
    assert mirrored == pytest.approx(one, abs=1e-5)
