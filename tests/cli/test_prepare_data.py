"""`framework prepare-data` as docs/data.md shows it (each command through its own entry in this
process): a user's compressed corpus and tokenizer,
prepared ahead; the run that follows (from the same directory, its paths relative) finds the store
ready and prepares nothing."""
from __future__ import annotations

import gzip
import json
import shlex

import pytest

from tests.cli.helpers import framework_cmd
from tests.conftest import TINY_GPT
from tests.helpers.text_data import stdlib_documents, train_tokenizer
from tests.test_docs import shown_lines

pytest.importorskip("tokenizers")
pytestmark = pytest.mark.slow


def test_the_readme_prepares_a_corpus_ahead_and_the_run_reuses_it(tmp_path):
    texts = stdlib_documents(24, max_chars=3000)
    for part, chunk in (("a", texts[:12]), ("b/c", texts[12:])):
        (tmp_path / "corpus" / part).mkdir(parents=True)
        with gzip.open(tmp_path / "corpus" / part / "shard.jsonl.gz", "wt") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in chunk)
    train_tokenizer(tmp_path / "tok", texts)
    prepare_line = next(a for _, a in shown_lines(r"^\s*framework (prepare-data .*data.tokenizer.*)$"))
    train_line, stream_line = (a for _, a in shown_lines(r"^\s*python train\.py (data=text_files .*jsonl\.gz.*)$"))
    env = {"FRAMEWORK_DATA_CACHE": str(tmp_path / "cache")}

    prepared = framework_cmd(*shlex.split(prepare_line), cwd=tmp_path, env=env, in_process=True)
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    assert "ready: " in prepared.stdout
    tokens = {name: int(count.replace(",", "")) for name, count in
              (part.split(" ")[:2] for part in prepared.stdout.split("; ")[1].split(", "))}
    assert tokens["train"] > 10_000 and tokens["val"] > 0  # a BPE of 300 ids: fewer tokens than bytes
    assert tokens["train"] + tokens["val"] < sum(len(t.encode()) for t in texts)

    again = framework_cmd(*shlex.split(prepare_line), cwd=tmp_path, env=env, in_process=True)
    assert again.returncode == 0 and "data: prepar" not in again.stdout, again.stdout

    # the docs' run, on one process here (its 8 fsdp processes planned below)
    args = [a for a in shlex.split(train_line) if not a.startswith(("strategy=", "devices="))]
    tiny = [o for o in TINY_GPT if not o.startswith("data.")]
    run = framework_cmd("train", *args, *tiny, "trainer.max_steps=2", "trainer.val_every=2", "name=run", cwd=tmp_path,
                        env=env, in_process=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "data: prepar" not in run.stdout + run.stderr, run.stdout[-2000:]
    assert len(list((tmp_path / "cache").iterdir())) <= 2  # one store (and its lock): the run reused it
    validated = framework_cmd("plan", *shlex.split(train_line), cwd=tmp_path, env=env, in_process=True)
    assert validated.returncode == 0, validated.stderr[-2000:]
    assert "8 process(es)" in validated.stdout and "fsdp" in validated.stdout

    # the docs' streamed run: nothing prepared, its 5000 steps cut to 2 here; 24 documents hold
    # none for validation at 5% (a store then lends one of training's, a stream cannot): 20%
    streamed = framework_cmd("train", *shlex.split(stream_line), *tiny, "trainer.max_steps=2", "trainer.val_every=2",
                             "name=streamed", "data.val_percent=20", f"data.cache_dir={tmp_path / 'stream-cache'}",
                             cwd=tmp_path, env=env, in_process=True)
    assert streamed.returncode == 0, streamed.stderr[-3000:]
    assert "data: prepar" not in streamed.stdout + streamed.stderr
    assert [p.name.split("-")[0] for p in (tmp_path / "stream-cache").iterdir()] == ["stream"]  # counts, no store
