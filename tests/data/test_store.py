"""Data at scale (framework/data/sources.py, prepare.py, store.py, ranks.py): every format read as
the same documents, the store the same at any number of preparing processes and ranges, the split
by each document's own hash (a grown corpus keeps its validation out of training), reused until a
file or the tokenizer changes, prepared once under a lock, never bounded by a collective's timeout;
a resume on other data refused; bad input named, nothing partial left behind."""
from __future__ import annotations

import bz2
import gzip
import json
import multiprocessing
import os
import zlib

import pytest

from framework.data import prepare as prepare_module
from framework.data import sources
from framework.data.store import read_manifest
from framework.data.text_files import TextFiles
from framework.errors import ConfigError, ExitCode, RunExit, StorageError
from tests.cli.helpers import framework_cmd
from tests.conftest import TINY_GPT, checkpoints, run_inprocess, run_train
from tests.helpers.in_process import run_command
from tests.helpers.text_data import stdlib_documents, train_tokenizer, write_jsonl

TEXTS = stdlib_documents(30, max_chars=1500)
TINY = [*(a for a in TINY_GPT if not a.startswith("data.max_bytes")), "data.block_size=32"]  # the tiny GPT, on text_files


def dm(tmp_path, **kwargs) -> TextFiles:
    kwargs.setdefault("cache_dir", str(tmp_path / "cache"))
    return TextFiles(block_size=32, batch_size=4, **kwargs)


def all_tokens(data: TextFiles, split: str = "train") -> list[int]:
    dataset = {"train": data.train_dataset, "val": data.val_dataset, "test": data.test_dataset}[split]()
    view = dataset.split
    return view.tokens(0, view.tokens_total).tolist()


def split_by_hash(texts, val_percent: int = 5) -> tuple[list[int], list[int]]:
    """(train, val) byte tokens: a document is held out when the bucket of its text's hash is below
    val_percent; where none is, the one with the smallest hash (framework/data/prepare.py)."""
    held = [t for t in texts if zlib.crc32(t.encode()) % 100 < val_percent] or [min(texts, key=lambda t: zlib.crc32(t.encode()))]
    return ([b for t in texts if t not in held for b in t.encode()], [b for t in texts if t in held for b in t.encode()])


def _zstd_open(path, mode):
    import zstandard

    return zstandard.open(path, mode)


@pytest.mark.parametrize("fmt", ["jsonl", "json-array", "jsonl.gz", "jsonl.bz2", "jsonl.zst", "csv", "parquet"])
def test_every_format_gives_the_same_documents(tmp_path, fmt):
    if fmt == "jsonl.zst":
        pytest.importorskip("zstandard", reason="'framework[data]' reads .zst")
    folder = tmp_path / "d"
    folder.mkdir()
    rows = [{"body": t, "n": i} for i, t in enumerate(TEXTS)]
    if fmt == "json-array":  # pretty-printed, as Alpaca ships
        (folder / "rows.json").write_text(json.dumps(rows, indent=2))
    elif fmt.startswith("jsonl"):
        text = "".join(json.dumps(r) + "\n" for r in rows).encode()
        opener = {"jsonl": open, "jsonl.gz": gzip.open, "jsonl.bz2": bz2.open, "jsonl.zst": _zstd_open}[fmt]
        with opener(folder / f"rows.{fmt}", "wb") as f:
            f.write(text)
    else:
        import pandas as pd

        frame = pd.DataFrame(rows)
        frame.to_parquet(folder / "rows.parquet") if fmt == "parquet" else frame.to_csv(folder / "rows.csv", index=False)
    data = dm(tmp_path, files=str(folder), text_field="body", add_eos=False)  # a folder: every file below it
    assert data.problems() == []
    assert (all_tokens(data), all_tokens(data, "val")) == split_by_hash(TEXTS)


@pytest.mark.parametrize("unit,separator", [("line", None), ("paragraph", None), ("document", "<|sep|>")])
@pytest.mark.slow  # a fresh interpreter or a pool of processes (make test-fast starts none)
def test_plain_text_by_line_paragraph_or_separator_at_any_number_of_processes(tmp_path, monkeypatch, unit, separator):
    """Large line-based files are cut into byte ranges read in parallel: the store is the same
    for any number of processes and ranges (tiny ranges forced here)."""
    body = ("\n\n" if unit == "paragraph" else "\n" if unit == "line" else separator).join(
        t.replace("\n\n", "\n").strip() for t in TEXTS)
    (tmp_path / "corpus.txt").write_text(body)
    kwargs = {"files": str(tmp_path / "corpus.txt"), "text_unit": unit, "separator": separator, "add_eos": False}
    one = dm(tmp_path, cache_dir=str(tmp_path / "c1"), num_proc=1, **kwargs)
    assert len(read_manifest(one._store)["splits"]["train"]["shards"]) == 1  # the whole file, one unit
    monkeypatch.setattr(sources, "RANGE_BYTES", 3000)
    prepared_by = []  # the process of each unit, as the results reach the preparing process
    collect = prepare_module._hold_out_one_if_empty
    monkeypatch.setattr(prepare_module, "_hold_out_one_if_empty",
                        lambda spec, results, out: (prepared_by.extend(r.pid for r in results), collect(spec, results, out)))
    ranged = dm(tmp_path, cache_dir=str(tmp_path / "c2"), num_proc=2, **kwargs)
    manifest = read_manifest(ranged._store)
    units = len(manifest["splits"]["train"]["shards"])
    assert units > 3 if separator is None else units == 1  # byte ranges (a separator: the file whole)
    if separator is None:  # a pool of 2 processes prepared the units, none of them this one
        assert manifest["processes"] == 2 and len(prepared_by) >= units and os.getpid() not in prepared_by
    else:
        assert manifest["processes"] == 1 and prepared_by == [os.getpid()]
    assert all_tokens(one) == all_tokens(ranged) and all_tokens(one, "val") == all_tokens(ranged, "val")
    assert one.train_dataset().split.documents > 25  # many documents in one file


@pytest.mark.slow  # a fresh interpreter or a pool of processes (make test-fast starts none)
def test_small_files_are_prepared_in_the_runs_own_process_unless_processes_are_asked_for(tmp_path, monkeypatch):
    """data.num_proc=null: a pool (fresh interpreters) only for files of 4 MiB and more; below, the
    run's own process prepares; the store is the same either way."""

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    write_jsonl(tmp_path / "a.jsonl", TEXTS[:15])
    write_jsonl(tmp_path / "b.jsonl", TEXTS[15:])
    files = str(tmp_path / "*.jsonl")
    small = dm(tmp_path, files=files, cache_dir=str(tmp_path / "c1"))
    assert read_manifest(small._store)["processes"] == 1
    monkeypatch.setattr(prepare_module, "POOL_FROM_BYTES", 1)
    pooled = dm(tmp_path, files=files, cache_dir=str(tmp_path / "c2"))
    assert read_manifest(pooled._store)["processes"] == 2
    assert all_tokens(small) == all_tokens(pooled) and all_tokens(small, "val") == all_tokens(pooled, "val")


def test_a_grown_corpus_keeps_validation_out_of_training(tmp_path):
    write_jsonl(tmp_path / "c" / "b.jsonl", TEXTS[:20])
    held = [t for t in TEXTS[:20] if zlib.crc32(t.encode()) % 100 < 20]
    assert held  # the documents validation holds out by their own hash
    write_jsonl(tmp_path / "c" / "a.jsonl", TEXTS[20:])  # sorts first: row numbers would all move
    after = dm(tmp_path, files=str(tmp_path / "c" / "*.jsonl"), add_eos=False, val_percent=20)
    val, train = bytes(all_tokens(after, "val")), bytes(all_tokens(after))
    assert all(t.encode() in val and t.encode() not in train for t in held)


def test_a_retrained_tokenizer_at_the_same_path_prepares_again(tmp_path, capsys):
    write_jsonl(tmp_path / "c" / "a.jsonl", TEXTS)
    train_tokenizer(tmp_path / "tok", TEXTS, vocab_size=300)
    first = dm(tmp_path, files=str(tmp_path / "c" / "a.jsonl"), tokenizer=str(tmp_path / "tok"))
    first.prepare_data(say=print)
    old = all_tokens(first)
    train_tokenizer(tmp_path / "tok", TEXTS[::-1], vocab_size=280)
    second = dm(tmp_path, files=str(tmp_path / "c" / "a.jsonl"), tokenizer=str(tmp_path / "tok"))
    second.prepare_data(say=print)
    assert "preparing again: the tokenizer changed (its file's contents), so the token ids did" in capsys.readouterr().out
    assert second._store == first._store and all_tokens(second) != old


def _prepare_in_a_process(args):
    path, cache, said = args
    data = TextFiles(files=path, cache_dir=cache, block_size=32, num_proc=1)
    lines = []

    def say(line):
        lines.append(line)
        said.put(line)

    data.prepare_data(say=say)
    return str(data._store), lines


@pytest.mark.slow  # a fresh interpreter or a pool of processes (make test-fast starts none)
def test_processes_sharing_a_cache_prepare_once(tmp_path):
    """Two processes start preparing while the store's lock is held (the overlap is forced, not
    left to timing): both wait, then one prepares and the other finds the store ready."""
    import fcntl

    write_jsonl(tmp_path / "c" / "a.jsonl", TEXTS * 20)
    path, cache = str(tmp_path / "c" / "a.jsonl"), str(tmp_path / "cache")
    directory = TextFiles(files=path, cache_dir=cache, block_size=32, num_proc=1).store_spec().directory()
    directory.parent.mkdir(parents=True)
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, open(directory.with_name(directory.name + ".lock"), "a+") as held:
        said = manager.Queue()
        fcntl.flock(held, fcntl.LOCK_EX)  # as a third process preparing it would
        with context.Pool(2) as pool:
            running = pool.map_async(_prepare_in_a_process, [(path, cache, said)] * 2)
            waiting = [said.get(timeout=120) for _ in range(2)]
            assert all("is preparing this data" in line and "waiting for it" in line for line in waiting), waiting
            fcntl.flock(held, fcntl.LOCK_UN)
            done = running.get(timeout=300)
    assert len({store for store, _ in done}) == 1
    prepared = [lines for _, lines in done if any("data: prepared" in line for line in lines)]
    assert len(prepared) == 1  # the other waited on the lock again and found it ready
    assert not [p for p in (tmp_path / "cache").iterdir() if ".partial" in p.name]


@pytest.mark.parametrize("content,message", [
    (b'{"text": "fine"}\n{"text": broken}\n', "bad.jsonl, line 2: does not read as JSON (JSONDecodeError"),
    (b'{"text": "fine"}\n[1, 2]\n', "bad.jsonl, line 2: a JSON list, not an object with fields"),
    (b'{"text": "fine"}\n{"body": "x"}\n{"text": "y"}\n{"other": 1}\n',
     "data.text_field='text': 2 row(s) have no such field (the first: "),
])
def test_a_row_that_does_not_read_is_named_and_nothing_is_left(tmp_path, content, message):
    (tmp_path / "bad.jsonl").write_bytes(content)
    with pytest.raises(ConfigError) as refused:
        dm(tmp_path, files=str(tmp_path / "bad.jsonl")).prepare_data()
    assert message in str(refused.value)
    assert not [p for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")]


def test_text_that_is_not_utf8_and_a_corpus_smaller_than_a_block(tmp_path):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (tmp_path / "ok.txt").write_text("more text\n")
    with pytest.raises(ConfigError, match=r"latin1.txt: not UTF-8 text \(byte 3: b'\\xe9'\); plain-text files must be"):
        dm(tmp_path, files=str(tmp_path / "*.txt")).prepare_data()
    (tmp_path / "latin1.txt").unlink()
    (tmp_path / "ok2.txt").write_text("and a little more\n")
    with pytest.raises(ConfigError, match=r"the training split holds \d+ tokens in 1 document\(s\), which makes no "
                                          r"sample of data.block_size=32 tokens"):
        dm(tmp_path, files=str(tmp_path / "*.txt")).prepare_data()


def test_a_vocabulary_the_token_type_cannot_hold_is_refused(tmp_path):
    write_jsonl(tmp_path / "c" / "a.jsonl", TEXTS)
    train_tokenizer(tmp_path / "tok", TEXTS, vocab_size=300)
    with pytest.raises(ConfigError, match="data.token_dtype=uint8: the tokenizer has 300 tokens, more ids than uint8 "
                                          "holds; use data.token_dtype=uint16 or auto"):
        dm(tmp_path, files=str(tmp_path / "c" / "a.jsonl"), tokenizer=str(tmp_path / "tok"), token_dtype="uint8")
    store = dm(tmp_path, files=str(tmp_path / "c" / "a.jsonl"), tokenizer=str(tmp_path / "tok"))
    assert store.token_dtype == "uint16" and dm(tmp_path, files=str(tmp_path / "c" / "a.jsonl")).token_dtype == "uint8"


def test_a_disk_that_fills_while_preparing_keeps_the_data_prepared_before(tmp_path):
    from tests.helpers.tmpfs import tmpfs

    write_jsonl(tmp_path / "c" / "a.jsonl", TEXTS)
    with tmpfs(tmp_path / "disk", "size=1m") as mount:  # skipped where no tmpfs can be mounted (not root)
        small = dm(tmp_path, files=str(tmp_path / "c" / "a.jsonl"), cache_dir=str(mount))
        small.prepare_data()
        kept = set(os.listdir(small._store))
        (tmp_path / "c" / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS * 40))
        with pytest.raises(StorageError, match=r"the disk filled while preparing the data in .*: the partial shards "
                                               r"were removed, data prepared before \(if any\) is kept"):
            dm(tmp_path, files=str(tmp_path / "c" / "a.jsonl"), cache_dir=str(mount)).prepare_data()
        assert set(os.listdir(small._store)) == kept and not [p for p in os.listdir(mount) if ".partial" in p]


@pytest.mark.slow
def test_two_processes_wait_for_a_preparation_longer_than_the_collective_timeout(tmp_path):
    """strategy.timeout_s=2 while rank zero prepares for longer: the other rank waits on the
    process group's store, with no time limit, and both train."""
    documents = stdlib_documents(200, max_chars=20000)
    write_jsonl(tmp_path / "c" / "a.jsonl", documents * 16)  # ~14 MB through a BPE tokenizer: some seconds
    train_tokenizer(tmp_path / "tok", documents[:20], vocab_size=300)
    result = run_train([*TINY, "data=text_files", "data.files=c/a.jsonl", "data.cache_dir=cache", "data.num_proc=1",
                        "data.tokenizer=tok",
                        "strategy=ddp", "devices=2", "strategy.timeout_s=2", "trainer.max_steps=2",
                        "trainer.val_every=2", "name=slow"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads(next((tmp_path / "cache").glob("text-*/manifest.json")).read_text())
    assert manifest["seconds"] > 2  # it did outlast the timeout


@pytest.mark.slow
def test_a_resume_on_other_data_is_refused_unless_allowed(tmp_path):
    write_jsonl(tmp_path / "c" / "a.jsonl", TEXTS * 4)
    base = [*TINY, "data=text_files", f"data.files={tmp_path / 'c' / '*.jsonl'}",
            f"data.cache_dir={tmp_path / 'cache'}", "trainer.val_every=2", "callbacks=[checkpoint]"]
    run_inprocess([*base, "trainer.max_steps=2"], tmp_path / "run")
    checkpoint = checkpoints(tmp_path / "run")[-1]
    write_jsonl(tmp_path / "c" / "b.jsonl", TEXTS[:10])  # files added
    with pytest.raises(RunExit) as refused:
        run_inprocess([*base, "trainer.max_steps=4", f"ckpt_path={checkpoint}"], tmp_path / "resumed")
    assert refused.value.code == ExitCode.USER_ERROR
    run_inprocess([*base, "trainer.max_steps=4", f"ckpt_path={checkpoint}", "data.allow_changed=true"],
                  tmp_path / "allowed")
    assert checkpoints(tmp_path / "allowed")[-1].name == "step_000004"


@pytest.mark.slow
def test_prepare_data_then_train_finds_it_ready(tmp_path):
    write_jsonl(tmp_path / "c" / "a.jsonl", TEXTS * 4)
    args = ["data=text_files", "data.files=c/*.jsonl", "data.cache_dir=cache"]
    ready = framework_cmd("prepare-data", *args, cwd=tmp_path, in_process=True)
    assert ready.returncode == 0 and "data: prepared" in ready.stdout and "ready:" in ready.stdout, ready.stderr
    again = framework_cmd("prepare-data", *args, cwd=tmp_path, in_process=True)
    assert "data: prepared" not in again.stdout and "ready:" in again.stdout
    run = run_command(["train", *TINY, *args, "trainer.max_steps=1", "trainer.val_every=1", "name=r"], tmp_path)
    assert run.returncode == 0 and "data: prepared" not in run.stdout, run.stderr[-2000:]
    refused = framework_cmd("prepare-data", "data=text_files", "data.files=c/*.jsonl", "data.text_field=body",
                            cwd=tmp_path, in_process=True)
    assert refused.returncode == 2 and "data.text_field='body'" in refused.stderr
