"""A user's own class, not packaged: selected by `_target_` on the command line or by a YAML in the
user's config directory, trusted by the user, and run like a built-in."""
from __future__ import annotations

import csv
import textwrap

import pytest

from tests.conftest import TINY_GPT
from tests.helpers.in_process import run_command

ARGS = [*TINY_GPT, "trainer.max_steps=3", "trainer.val_every=3", "trainer.log_every=1", "devices=2"]


def losses(run_dir):
    with open(run_dir / "metrics.csv") as f:
        return [(r["step"], r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")]


@pytest.fixture
def user_code(tmp_path):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "strategies.py").write_text(textwrap.dedent("""\
        from pathlib import Path

        from framework.strategy.ddp import DDPStrategy


        class MarkingDDP(DDPStrategy):
            \"\"\"DDP that records, per rank, that it wrapped the model (the configure_ddp pattern).\"\"\"

            name = "marking_ddp"

            def __init__(self, *args, marker_dir: str = ".", **kwargs):
                super().__init__(*args, **kwargs)
                self.marker_dir = marker_dir

            def wrap_model(self, model):
                wrapped = super().wrap_model(model)
                Path(self.marker_dir, f"wrapped_rank{self.global_rank}").write_text(type(wrapped).__name__)
                return wrapped
        """))
    configs = tmp_path / "my_configs" / "strategy"
    configs.mkdir(parents=True)
    (configs / "marking_ddp.yaml").write_text(
        f"# DDP that leaves a marker per rank\n_target_: mypkg.strategies.MarkingDDP\nmarker_dir: {tmp_path}\n"
        "find_unused_parameters: false\n")
    return {"PYTHONPATH": str(tmp_path)}


@pytest.mark.slow
def test_a_subclass_selected_by_target_or_by_a_yaml_of_the_user(user_code, tmp_path):
    reference = run_command(["train", "name=ddp", "strategy=ddp", *ARGS], tmp_path)
    assert reference.returncode == 0, reference.stderr[-2000:]
    by_target = run_command(["train", "name=by_target", "strategy=ddp", "strategy._target_=mypkg.strategies.MarkingDDP",
                           f"+strategy.marker_dir={tmp_path}", "trust.allow=[mypkg.]", *ARGS], tmp_path, user_code)
    assert by_target.returncode == 0, by_target.stderr[-2000:]
    assert {p.name for p in tmp_path.glob("wrapped_rank*")} == {"wrapped_rank0", "wrapped_rank1"}
    assert (tmp_path / "wrapped_rank0").read_text() == "DistributedDataParallel"
    assert losses(tmp_path / "outputs" / "by_target") == losses(tmp_path / "outputs" / "ddp")
    for marker in tmp_path.glob("wrapped_rank*"):
        marker.unlink()
    by_yaml = run_command(["train", "--config-dir", str(tmp_path / "my_configs"), "name=by_yaml", "strategy=marking_ddp",
                         "trust.allow=[mypkg.]", *ARGS], tmp_path, user_code)
    assert by_yaml.returncode == 0, by_yaml.stderr[-2000:]
    assert {p.name for p in tmp_path.glob("wrapped_rank*")} == {"wrapped_rank0", "wrapped_rank1"}
    assert losses(tmp_path / "outputs" / "by_yaml") == losses(tmp_path / "outputs" / "ddp")
    untrusted = run_command(["train", "name=untrusted", "strategy=ddp", "strategy._target_=mypkg.strategies.MarkingDDP", *ARGS],
                          tmp_path, user_code)
    assert untrusted.returncode == 2 and "trust.allow=[mypkg.strategies.]" in untrusted.stderr
