"""data.streaming=true (framework/data/stream.py): the files read while training, never copied into
a store; the same samples as the store where unshuffled, the same positions at every world size,
and a resume that continues the stream exactly."""
from __future__ import annotations

import csv
import json
import os

import pytest
import torch

from framework.data.chat_files import ChatFiles
from framework.data.stream import TokenStream
from framework.data.text_files import TextFiles
from framework.errors import ConfigError
from tests.cli.helpers import framework_cmd
from tests.conftest import TINY_GPT, assert_resume_is_exact, checkpoints, run_inprocess
from tests.helpers.in_process import run_command
from tests.helpers.text_data import stdlib_documents, write_jsonl

TINY = [*(a for a in TINY_GPT if not a.startswith("data.max_bytes")), "data.block_size=32"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream")
    texts = stdlib_documents(40, max_chars=5000)
    write_jsonl(root / "a.jsonl", texts[:20])
    write_jsonl(root / "b.jsonl", texts[20:])
    return root


def settings(corpus, tmp_path, **kwargs):
    return {"files": str(corpus / "*.jsonl"), "cache_dir": str(tmp_path / "cache"), "block_size": 64,
            "val_percent": 10, **kwargs}


@pytest.mark.parametrize("packing", [True, False])
def test_an_unshuffled_pass_is_the_prepared_stores_training_split(corpus, tmp_path, packing):
    store = TextFiles(**settings(corpus, tmp_path, packing=packing), shuffle=False)
    store.prepare_data()
    prepared, prepared_val = store.train_dataset(), store.val_dataset()
    stream = TextFiles(**settings(corpus, tmp_path, packing=packing), streaming=True, shuffle=False)
    streamed = stream.train_dataset()
    assert isinstance(streamed, TokenStream)
    n = len(prepared)
    assert n > 30
    for i in range(n):
        assert torch.equal(streamed[i]["input_ids"], prepared[i]["input_ids"]), i
    assert torch.equal(streamed[n]["input_ids"], prepared[0]["input_ids"])  # the next pass begins
    head = stream.val_dataset().head(5)  # fewer where the split holds fewer
    assert len(head) == min(5, len(prepared_val)) >= 4
    assert all(torch.equal(head[i]["input_ids"], prepared_val[i]["input_ids"]) for i in range(len(head)))
    assert stream.fingerprint() != store.fingerprint()


def test_a_shuffled_stream_is_drawn_from_the_seed_and_a_jump_reads_only_what_it_must(corpus, tmp_path):
    def stream(seed):
        return TextFiles(**settings(corpus, tmp_path), streaming=True, stream_window=16).train_dataset().seeded(seed)

    first = stream(3)
    tokens_per_pass = None
    samples = []
    while tokens_per_pass is None:  # read until the first pass has been counted
        samples.append(first[len(samples)]["input_ids"])
        tokens_per_pass = first._pass_length()
    n = tokens_per_pass
    samples += [first[i]["input_ids"] for i in range(len(samples), 2 * n + 20)]
    assert not all(torch.equal(samples[i], samples[n + i]) for i in range(n))  # each pass in another order
    assert sum(int(s.sum()) for s in samples[:n]) != 0
    # Another process, with the counts file beside the stores: it jumps to the window that holds
    # position 2n + 5, skipping whole units unread, and serves the same sample.
    counts_file = next((tmp_path / "cache").glob("stream-*-train.json"))
    assert len(json.loads(counts_file.read_text())["units"]) == len(first.units) == 2
    again = stream(3)
    assert torch.equal(again[2 * n + 5]["input_ids"], samples[2 * n + 5])
    assert again._pass == 2 and again._window_start == 2 * n
    assert not torch.equal(stream(4)[5]["input_ids"], samples[5])  # another seed, another order
    # The files change: the counts no longer hold, the stream reads from its start again.
    times = (corpus / "b.jsonl").stat()
    os.utime(corpus / "b.jsonl", ns=(times.st_atime_ns, times.st_mtime_ns + 10**9))
    try:
        assert stream(3)._pass_length() is None
    finally:
        os.utime(corpus / "b.jsonl", ns=(times.st_atime_ns, times.st_mtime_ns))
    assert stream(3)._pass_length() == n  # the files as counted again


def test_streamed_settings_that_cannot_work_are_refused_by_key(corpus, tmp_path):
    with pytest.raises(TypeError, match="streaming"):  # chat data is always prepared: it has no such setting
        ChatFiles(files=str(corpus / "*.jsonl"), streaming=True)
    stream = TextFiles(**settings(corpus, tmp_path, block_size=10**7), streaming=True)
    with pytest.raises(ConfigError, match=r"the training split of the streamed files holds no sample of "
                                          r"data.block_size=10000000 tokens"):
        stream.train_dataset()[0]
    problems = TextFiles(**settings(corpus, tmp_path), streaming=True).run_problems(
        {"max_steps": None, "val_batches": None, "test_at_end": True, "test_batches": None}, "fit")
    assert len(problems) == 3
    assert "trainer.max_steps" in problems[0] and "trainer.val_batches" in problems[1]
    assert "trainer.test_batches" in problems[2]


def _losses(run):
    return {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(open(run / "metrics.csv"))
            if r.get("train/loss")}


@pytest.mark.slow
def test_a_streamed_run_resumes_on_the_next_samples_at_another_world_size(corpus, tmp_path, monkeypatch):
    """ddp on 2 processes streams 6 steps; its checkpoint at step 3 resumed on one process at twice
    the per-rank batch (the same global batch) logs the straight run's losses at steps 4-6."""
    base = [*TINY, "data=text_files", f"data.files={corpus / '*.jsonl'}", "data.cache_dir=cache",
            "data.streaming=true", "data.stream_window=8", "model.dropout=0.0", "trainer.val_every=3", "trainer.log_every=1",
            "callbacks=[checkpoint]", "callbacks.checkpoint.every_n_steps=3", "trainer.max_steps=6"]
    run = tmp_path / "outputs" / "straight"
    monkeypatch.chdir(tmp_path)  # data.cache_dir=cache, relative as a user's
    run_inprocess([*base, "strategy=ddp", "devices=2"], run)
    assert not list((tmp_path / "cache").glob("text-*"))  # nothing prepared
    step3 = next(c for c in checkpoints(run) if c.name == "step_000003")
    resumed = run_command(["train", *base, "data.batch_size=16", f"ckpt_path={step3}", "name=resumed"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "the stream continues at sample 48" in resumed.stdout + resumed.stderr
    want, got = _losses(run), _losses(tmp_path / "outputs" / "resumed")
    assert sorted(got) == [4, 5, 6]
    for step in (4, 5, 6):
        assert got[step] == pytest.approx(want[step], rel=1e-5), (step, got, want)


@pytest.mark.slow
def test_a_streamed_run_needs_a_step_count_and_prepare_data_has_nothing_to_do(corpus, tmp_path):
    args = ["data=text_files", f"data.files={corpus / '*.jsonl'}", "data.cache_dir=cache", "data.streaming=true"]
    refused = run_command(["train", *TINY, *args, "trainer.max_steps=null", "trainer.max_epochs=1", "name=x"], tmp_path)
    assert refused.returncode == 2 and "give trainer.max_steps" in refused.stderr, refused.stderr[-2000:]
    ready = framework_cmd("prepare-data", *args, cwd=tmp_path, in_process=True)
    assert ready.returncode == 0 and "data.streaming=true" in ready.stdout, ready.stdout + ready.stderr
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").glob("text-*"))


@pytest.mark.slow
def test_a_streamed_resume_with_loader_workers_is_bit_exact(corpus, tmp_path):
    """Two loader workers, each reading the stream itself: 6 steps straight and 3 + resume=auto + 3
    end on bit-identical weights and optimizer state (the resume crosses into the stream's second
    window of 8 samples, re-read from the counted units)."""
    base = [*TINY, "data=text_files", f"data.files={corpus / '*.jsonl'}", f"data.cache_dir={tmp_path / 'cache'}",
            "data.streaming=true", "data.stream_window=8", "data.num_workers=2", "trainer.val_every=3",
            "callbacks=[checkpoint]", "callbacks.checkpoint.every_n_steps=3"]
    assert_resume_is_exact(base, tmp_path, steps=6)


def test_an_endless_split_is_refused_where_it_would_be_read_to_its_end(corpus, tmp_path):
    from framework.data.loaders import build_loader
    from framework.strategy.single_device import SingleDeviceStrategy

    data = TextFiles(**settings(corpus, tmp_path), streaming=True)
    strategy = SingleDeviceStrategy()
    for split, fix in (("val", "give trainer.val_batches a number"), ("train", "use the validation or test split")):
        with pytest.raises(ConfigError, match=rf"the streamed {split} split has no end to read to; {fix}"):
            build_loader(data, strategy, split, seed=0, limit_batches=None, training=False)
    held = build_loader(data, strategy, "val", seed=0, limit_batches=2, training=False)
    assert len(held.dataset) == 2 * data.val_batch_size


@pytest.mark.parametrize("packing", [False, True])
def test_a_shuffled_pass_is_a_permutation_of_the_split(corpus, tmp_path, packing):
    """Every pass of a shuffled stream serves each sample of the split once: unpacked, the same
    documents as the unshuffled pass in another order; packed (blocks cut from the documents in
    the pass's unit order), the same tokens, as many times each, but for the one short tail a pass
    leaves out."""
    def stream(shuffle):
        data = TextFiles(**settings(corpus, tmp_path, packing=packing), streaming=True, stream_window=16,
                         shuffle=shuffle)
        return data.train_dataset().seeded(3)

    def one_pass(dataset):
        samples = []
        while dataset._pass_length() is None or len(samples) < dataset._pass_length():
            samples.append(tuple(dataset[len(samples)]["input_ids"].tolist()))
        return samples

    plain, shuffled = one_pass(stream(False)), one_pass(stream(True))
    assert shuffled != plain and len(shuffled) == len(plain) > 30
    if not packing:
        assert sorted(shuffled) == sorted(plain)
    else:
        counts = [torch.bincount(torch.tensor([t for s in samples for t in s]), minlength=256) for samples in
                  (plain, shuffled)]
        differ = int((counts[0] - counts[1]).abs().sum())
        assert differ < 2 * 64  # at most a block's worth moved between the two passes' left-out tails
