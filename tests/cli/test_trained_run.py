"""A finished run composed again for `framework test` / `predict` under another strategy (or another
option of any group): the run's settings of the group it leaves (its overrides, its recipe's
values) are dropped with it; the same option keeps them. Runs trained with the strategies that
have settings of their own (and two without), each tested under every strategy: 133 pairs, one
code path for all of them (all 361 pairs took 95 s)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from framework.cli.trained_run import compose_run_config
from framework.config.compose import composer
from framework.paths import conf_dir
from tests.conftest import TINY_GPT, checkpoints
from tests.helpers.in_process import run_command

STRATEGIES = sorted(p.stem for p in (conf_dir() / "strategy").glob("*.yaml"))
# a setting of the run's own strategy that the others do not have, given on its command line
OWN_SETTING = {"model_parallel": "strategy.tensor_parallel_size=2", "hsdp": "strategy.shard_size=2",
               "fsdp": "strategy.reshard_after_forward=false", "ddp": "strategy.bucket_cap_mb=5",
               "deepspeed_stage_3": "strategy.partitioned_init=false"}


@pytest.fixture(scope="module")
def a_run(tmp_path_factory) -> Path:
    """A real run directory (one step), whose .hydra record the matrix below rewrites per strategy."""
    root = tmp_path_factory.mktemp("trained")
    result = run_command(["train", *TINY_GPT, "trainer.max_steps=1", "trainer.val_every=1", "name=run"], root)
    assert result.returncode == 0, result.stderr[-2000:]
    return root / "outputs" / "run"


def _as_if_trained_with(run: Path, strategy: str, where: Path) -> Path:
    """`run`'s directory as if its command had been `train.py strategy=<strategy> <its own setting>`."""
    shutil.copytree(run, where)
    overrides = [f"strategy={strategy}", *([OWN_SETTING[strategy]] if strategy in OWN_SETTING else [])]
    hydra = OmegaConf.load(where / ".hydra" / "hydra.yaml")
    hydra.hydra.runtime.choices.strategy = strategy
    OmegaConf.save(hydra, where / ".hydra" / "hydra.yaml")
    OmegaConf.save(OmegaConf.create([*OmegaConf.load(run / ".hydra" / "overrides.yaml"), *overrides]),
                   where / ".hydra" / "overrides.yaml")
    with composer(conf_dir()) as compose_one:
        config = compose_one("train", [*OmegaConf.load(where / ".hydra" / "overrides.yaml")])
    config.name = "run"
    OmegaConf.save(config, where / "config.yaml", resolve=True)
    return where


@pytest.mark.slow
def test_every_strategy_tests_a_run_of_every_other(a_run, tmp_path):
    with composer(conf_dir()) as compose_one:
        default = {s: OmegaConf.to_container(compose_one("train", [f"strategy={s}"]).strategy) for s in STRATEGIES}
    for trained in [*OWN_SETTING, "auto", "deepspeed_stage_1"]:
        run = _as_if_trained_with(a_run, trained, tmp_path / trained)
        checkpoint = checkpoints(run)[-1]
        for chosen in STRATEGIES:
            cfg = compose_run_config(run, checkpoint, [f"strategy={chosen}"], tmp_path)
            node = OmegaConf.to_container(cfg.strategy)
            if chosen != trained:  # the new option as it ships: nothing of the run's strategy carried over
                assert node == default[chosen], (trained, chosen)
            elif trained in OWN_SETTING:  # the same option keeps the run's settings
                key, value = OWN_SETTING[trained].removeprefix("strategy.").split("=")
                assert str(node[key]).lower() == value.lower(), trained
            assert cfg.model.n_embd == 32 and cfg.trainer.max_steps == 1  # the rest is the run's


@pytest.mark.slow
def test_a_run_directory_works_from_anywhere_and_refuses_to_test_on_what_it_trained_on(tmp_path):
    """Relative paths given to a run (data.files=corpus/...) are recorded absolute, so `framework test`
    from another directory finds its data; a test split that holds documents the run trained on
    (test_percent raised after training) is refused, unless --allow-overlap."""
    from tests.cli.helpers import framework_cmd
    from tests.helpers.text_data import stdlib_documents, write_jsonl

    project = tmp_path / "project"
    write_jsonl(project / "corpus" / "a.jsonl", stdlib_documents(30, max_chars=2000))
    tiny = [o for o in TINY_GPT if not o.startswith("data.")]
    result = run_command(["train", *tiny, "data=text_files", "data.files=corpus/a.jsonl", "data.test_percent=10",
                          "data.cache_dir=cache", "trainer.max_steps=2", "trainer.val_every=2", "name=run"], project)
    assert result.returncode == 0, result.stderr[-2000:]
    recorded = OmegaConf.load(project / "outputs" / "run" / "config.yaml").data
    assert recorded.files == str(project / "corpus" / "a.jsonl") and recorded.cache_dir == str(project / "cache")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    tested = framework_cmd("test", str(project / "outputs" / "run"), cwd=elsewhere, in_process=True)
    assert tested.returncode == 0 and "test/loss" in tested.stdout, tested.stderr[-2000:]
    refused = framework_cmd("test", str(project / "outputs" / "run"), "data.test_percent=30", cwd=elsewhere, in_process=True)
    assert refused.returncode == 2 and "data.test_percent=30 holds out documents of" in refused.stderr
    assert "that the run trained on" in refused.stderr and "--allow-overlap" in refused.stderr
    allowed = framework_cmd("test", str(project / "outputs" / "run"), "data.test_percent=30", "--allow-overlap",
                            cwd=elsewhere, in_process=True)
    assert allowed.returncode == 0 and "WARNING: data.test_percent=30" in allowed.stderr
    # the overlap is found by content, not by path: a copy of the training file, rows taken out of it
    trained = (project / "corpus" / "a.jsonl").read_text().splitlines(keepends=True)
    (project / "held.jsonl").write_text("".join(trained))
    copied = framework_cmd("test", str(project / "outputs" / "run"), f"data.test_files={project / 'held.jsonl'}",
                           cwd=elsewhere, in_process=True)
    assert copied.returncode == 2, copied.stderr[-2000:]
    assert f"data.test_files holds copies of files the run trained on ({project / 'held.jsonl'} = " in copied.stderr
    fresh = stdlib_documents(40, max_chars=2000)[30:]
    write_jsonl(project / "mixed.jsonl", fresh)
    (project / "mixed.jsonl").write_text((project / "mixed.jsonl").read_text() + "".join(trained[:12]))
    taken = framework_cmd("test", str(project / "outputs" / "run"), f"data.test_files={project / 'mixed.jsonl'}",
                          cwd=elsewhere, in_process=True)
    assert taken.returncode == 2 and "of its 22 document(s) with the tokens of documents the run trained on" in \
        " ".join(taken.stderr.split()), taken.stderr[-2000:]
    write_jsonl(project / "fresh.jsonl", fresh)
    unseen = framework_cmd("test", str(project / "outputs" / "run"), f"data.test_files={project / 'fresh.jsonl'}",
                           cwd=elsewhere, in_process=True)
    assert unseen.returncode == 0 and "test/loss" in unseen.stdout, unseen.stderr[-2000:]
