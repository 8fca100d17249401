"""data=text_files: local files prepared once into a memory-mapped store, tokenised by bytes or a
local tokenizer, packed or padded; documents held out by a hash of their text; bad input named."""
from __future__ import annotations

import zlib

import pytest
import torch

from framework.config.resolvers import vocab_size
from framework.data.text_files import TextFiles
from framework.errors import ConfigError
from tests.helpers.text_data import stdlib_documents, train_tokenizer, write_jsonl


def bucket(text: str) -> int:
    """The split bucket of a document: a hash of its text (framework/data/prepare.py)."""
    return zlib.crc32(text.encode("utf-8")) % 100


@pytest.fixture
def corpus(tmp_path):
    texts = stdlib_documents(40, max_chars=800)
    write_jsonl(tmp_path / "a" / "part1.jsonl", texts[:20])
    write_jsonl(tmp_path / "a" / "part2.jsonl", texts[20:])
    return tmp_path, texts


def data(tmp_path, **kwargs):
    kwargs.setdefault("files", str(tmp_path / "a" / "*.jsonl"))
    return TextFiles(cache_dir=str(tmp_path / "cache"), batch_size=4, **kwargs)


def test_bytes_are_packed_into_full_blocks_of_the_rows_text(corpus):
    tmp_path, texts = corpus
    dm = data(tmp_path, val_files=str(tmp_path / "a" / "part2.jsonl"), files=str(tmp_path / "a" / "part1.jsonl"),
              block_size=64)
    train = dm.train_dataset()
    stream = b"".join(t.encode() for t in texts[:20])  # bytes have no end-of-text token
    assert len(train) == len(stream) // 64
    assert train[0]["input_ids"].tolist() == list(stream[:64])
    assert train[3]["input_ids"].dtype == torch.long and len(train[3]["input_ids"]) == 64
    val = dm.val_dataset()
    assert val[0]["input_ids"].tolist() == list(b"".join(t.encode() for t in texts[20:])[:64])


def test_a_local_tokenizer_encodes_ends_rows_with_eos_and_sizes_the_vocabulary(corpus):
    from tokenizers import Tokenizer

    tmp_path, texts = corpus
    directory = train_tokenizer(tmp_path / "tok", texts)
    dm = data(tmp_path, tokenizer=str(directory), block_size=32, val_percent=10)
    reference = Tokenizer.from_file(str(directory / "tokenizer.json"))
    eos = reference.token_to_id("<|endoftext|>")
    train_rows = [i for i in range(40) if bucket(texts[i]) >= 10]  # held out: by a hash of the document
    stream = [t for i in train_rows for t in reference.encode(texts[i], add_special_tokens=False).ids + [eos]]
    train = dm.train_dataset()
    assert train[0]["input_ids"].tolist() == stream[:32]
    assert len(train) > 0 and eos in torch.cat([train[i]["input_ids"] for i in range(len(train))]).tolist()
    assert vocab_size(str(directory)) == reference.get_vocab_size() == 300
    assert vocab_size("bytes") == 256


def test_padding_keeps_one_row_per_sample_with_masks_and_ignored_labels(corpus):
    tmp_path, _ = corpus
    write_jsonl(tmp_path / "short" / "rows.jsonl", ["ab", "hello world", "x" * 50, "", "zz"] * 4)
    dm = data(tmp_path, files=str(tmp_path / "short" / "*.jsonl"), packing=False, block_size=8, val_percent=20)
    rows = [dm.train_dataset()[i] for i in range(3)]
    assert all(len(r["input_ids"]) <= 8 for r in rows)
    batch = dm.collate()(rows)
    lengths = [len(r["input_ids"]) for r in rows]
    assert batch["input_ids"].shape == (3, max(lengths))
    assert batch["attention_mask"].sum(1).tolist() == lengths
    assert (batch["labels"][batch["attention_mask"] == 0] == -100).all()
    assert set(dm.example_batch()) == {"input_ids", "attention_mask", "labels"}


@pytest.mark.parametrize("fmt", ["parquet", "csv", "text"])
def test_parquet_csv_and_plain_text_read_the_same_way(tmp_path, fmt):
    texts = ["first document\n" * 20, "second one\n" * 20, "third\n" * 30] * 4
    folder = tmp_path / "d"
    folder.mkdir()
    if fmt == "text":
        for i, t in enumerate(texts):
            (folder / f"{i:02d}.txt").write_text(t)
        kwargs = {"files": str(folder / "*.txt")}
    else:
        import pandas as pd

        frame = pd.DataFrame({"body": texts})
        path = folder / f"rows.{fmt}"
        frame.to_parquet(path) if fmt == "parquet" else frame.to_csv(path, index=False)
        kwargs = {"files": str(folder / "rows.*"), "text_field": "body"}
    dm = TextFiles(cache_dir=str(tmp_path / "cache"), block_size=16, val_percent=25, **kwargs)
    assert dm.format == fmt
    total = len(dm.train_dataset()) + len(dm.val_dataset())
    assert total >= sum(len(t) for t in texts) // 16 - 2 * len(texts)  # each shard's tail is dropped at most


def test_preprocessing_is_cached_for_the_next_process(corpus, capsys):
    tmp_path, _ = corpus
    first = data(tmp_path, block_size=32)
    first.prepare_data(say=print)
    store = first._store
    assert "data: prepared" in capsys.readouterr().out and str(tmp_path / "cache") in str(store)
    again = data(tmp_path, block_size=32, num_proc=2)  # the number of processes changes nothing
    again.prepare_data(say=print)
    assert again._store == store and "prepared" not in capsys.readouterr().out  # opened, not remade
    assert torch.equal(again.train_dataset()[3]["input_ids"], first.train_dataset()[3]["input_ids"])
    before = first.fingerprint()
    (tmp_path / "a" / "part3.jsonl").write_text('{"text": "a document added later"}\n')
    grown = data(tmp_path, block_size=32)
    grown.prepare_data(say=print)
    assert "preparing again: the corpus changed since it was prepared: 1 file(s) added (part3.jsonl)" in \
        capsys.readouterr().out
    assert grown.fingerprint() != before


@pytest.mark.parametrize("kwargs,message", [
    ({"files": "/nowhere/*.jsonl"}, r"data.files: the pattern '/nowhere/\*.jsonl' matches no file"),
    ({"text_field": "body"}, r"data.text_field='body': 40 row\(s\) have no such field \(the first: .*part1.jsonl"),
    ({"format": "xml"}, "data.format='xml': choose one of csv, json, jsonl, parquet, text"),
    ({"text_unit": "word"}, "data.text_unit='word': choose one of document, paragraph, line"),
    ({"tokenizer": "/nowhere/tok"}, r"data.tokenizer='/nowhere/tok': no such tokenizer.json"),
    ({"block_size": 100000}, "makes no sample of data.block_size=100000 tokens"),
    ({"token_dtype": "int8"}, "data.token_dtype=.int8.: choose one of auto, uint8, uint16, uint32"),
])
def test_bad_data_settings_are_refused_by_key(corpus, kwargs, message):
    tmp_path, _ = corpus
    with pytest.raises(ConfigError, match=message):
        data(tmp_path, **kwargs).prepare_data()


def test_one_document_is_too_few_to_hold_out_validation(tmp_path):
    (tmp_path / "one.txt").write_text("only one file of text\n" * 50)
    with pytest.raises(ConfigError, match=r"the validation split holds no document.*data.text_unit=paragraph or line"):
        TextFiles(files=str(tmp_path / "one.txt"), cache_dir=str(tmp_path / "cache")).prepare_data()
    lines = TextFiles(files=str(tmp_path / "one.txt"), text_unit="line", block_size=8, cache_dir=str(tmp_path / "c2"))
    assert len(lines.train_dataset()) > len(lines.val_dataset()) > 0


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_problems_are_found_by_opening_each_file_before_any_preprocessing(tmp_path, fmt):
    """What `framework validate` and every run's preparation read: each file's first row."""
    import pandas as pd

    folder = tmp_path / "d"
    folder.mkdir()
    frame = pd.DataFrame({"body": ["some text"] * 3, "id": [1, 2, 3]})
    good = folder / f"good.{fmt}"
    {"jsonl": lambda: frame.to_json(good, orient="records", lines=True), "csv": lambda: frame.to_csv(good, index=False),
     "parquet": lambda: frame.to_parquet(good)}[fmt]()
    empty = folder / f"empty.{fmt}"
    empty.write_text("")
    assert TextFiles(files=str(good), format=fmt, text_field="body").problems() == []
    wrong_field = TextFiles(files=str(good), format=fmt).problems()
    assert wrong_field == [f"data.text_field='text': {good} has no such field (its first row has body, id); set "
                           "data.text_field to the one holding the text."]
    with_empty = TextFiles(files=str(good), val_files=str(empty), format=fmt, text_field="body").problems()
    assert with_empty == [f"data.val_files: {empty} is empty (a {fmt} file needs at least one row); remove it from "
                          "data.val_files or fill it."]


def test_problems_of_rows_that_do_not_parse_and_of_plain_text(tmp_path):
    (tmp_path / "bad.jsonl").write_text("not json at all\n")
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    (tmp_path / "blank.jsonl").write_text("\n\n")
    found = TextFiles(files=str(tmp_path / "*.jsonl")).problems()
    assert [p.split(": ", 1)[0] for p in found] == ["data.files"] * 3
    assert "bad.jsonl: line 1: does not read as JSON (JSONDecodeError" in found[0]
    assert "blank.jsonl: holds only blank lines" in found[1]
    assert "list.jsonl: line 1: a JSON list, not an object with fields" in found[2]
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "a.txt").write_text("")
    assert TextFiles(files=str(tmp_path / "t" / "*.txt")).problems() == [
        f"data.files: every file is empty ({tmp_path / 't' / 'a.txt'}); give files with text."]
    (tmp_path / "t" / "b.txt").write_text("some text")
    assert TextFiles(files=str(tmp_path / "t" / "*.txt")).problems() == []  # an empty text file among others reads


def test_a_test_split_is_held_out_by_percent_or_given_as_files(corpus):
    tmp_path, texts = corpus
    assert not data(tmp_path).has_test_split and data(tmp_path, block_size=32).test_dataset() is None
    held = data(tmp_path, block_size=32, val_percent=10, test_percent=20)
    buckets = [bucket(t) for t in texts]
    test_rows = [i for i, b in enumerate(buckets) if 10 <= b < 30]
    stream = b"".join(texts[i].encode() for i in test_rows)
    assert held.has_test_split and held.test_dataset()[0]["input_ids"].tolist() == list(stream[:32])
    train_rows = [i for i, b in enumerate(buckets) if b >= 30]
    assert held.train_dataset()[0]["input_ids"].tolist() == list(b"".join(texts[i].encode() for i in train_rows)[:32])
    given = data(tmp_path, files=str(tmp_path / "a" / "part1.jsonl"), test_files=str(tmp_path / "a" / "part2.jsonl"),
                 block_size=32)
    assert given.test_dataset()[0]["input_ids"].tolist() == list(b"".join(t.encode() for t in texts[20:])[:32])
    with pytest.raises(ConfigError, match="data.test_percent=95: with data.val_percent=5 no row is left"):
        data(tmp_path, test_percent=95)
