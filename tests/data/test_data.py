"""The shipped datasets and resumable loaders."""
from __future__ import annotations

import sysconfig

import torch

from framework.data.digits import Digits
from framework.data.loaders import build_loader
from framework.data.stdlib_text import StdlibText, stdlib_files
from framework.strategy.single_device import SingleDeviceStrategy


def test_stdlib_corpus_is_deterministic_and_split_by_file():
    a, b = StdlibText(max_bytes=400_000, block_size=16), StdlibText(max_bytes=400_000, block_size=16)
    train, val = a.train_dataset(), a.val_dataset()
    assert torch.equal(train.tokens, b.train_dataset().tokens) and torch.equal(val.tokens, b.val_dataset().tokens)
    assert 0.03 < len(val.tokens) / (len(train.tokens) + len(val.tokens)) < 0.3
    assert len(train.tokens) + len(val.tokens) <= 400_000
    x, y = train[3]
    assert x.shape == (16,) and torch.equal(x[1:], y[:-1]) and x.dtype == torch.int64
    files = stdlib_files()
    assert files and all("site-packages" not in p.parts and "test" not in p.parts for p in files)
    assert str(files[0]).startswith(sysconfig.get_paths()["stdlib"])


def _rows(dataset) -> set[tuple]:
    return {tuple(x.tolist()) + (int(y),) for x, y in dataset}


def test_digits_split():
    d = Digits()
    train, val, test = d.train_dataset(), d.val_dataset(), d.test_dataset()
    assert (len(train), len(val), len(test)) == (1077, 360, 360) and d.has_test_split
    x, y = val[0]
    assert x.shape == (64,) and 0.0 <= x.min() and x.max() <= 1.0 and 0 <= y <= 9
    assert len(_rows(test) & _rows(val)) <= 1 and len(_rows(test) & _rows(train)) <= 2  # a few images repeat in sklearn's set
    assert sorted(int(y) for _, y in test) != [0] * 360 and len({int(y) for _, y in test}) == 10
    none = Digits(test_every_nth=None)
    assert not none.has_test_split and none.test_dataset() is None and len(none.train_dataset()) == 1437


def test_the_digits_are_scikit_learns_without_importing_it(monkeypatch):
    """bundled_digits reads scikit-learn's file itself (importing sklearn costs a second in every
    process that builds the data): the same values as sklearn's load_digits, and no import of it."""
    import builtins

    from sklearn.datasets import load_digits

    from framework.data import digits

    imported, real_import = [], builtins.__import__

    def watched(name, *args, **kwargs):
        imported.append(name)
        return real_import(name, *args, **kwargs)

    digits.bundled_digits.cache_clear()
    monkeypatch.setattr(builtins, "__import__", watched)
    x, y = digits.bundled_digits()
    monkeypatch.undo()
    assert not [name for name in imported if name.split(".")[0] == "sklearn"]
    reference = load_digits()
    assert torch.equal(x, torch.tensor(reference.data, dtype=torch.float32) / 16.0)
    assert torch.equal(y, torch.tensor(reference.target, dtype=torch.long))


def test_digits_read_under_the_meta_device_first_still_hold_the_images():
    """Preflight builds the data's example batch under torch.device("meta"); the images are read
    once per process, so that first read must not leave meta tensors for the run that follows."""
    from framework.data import digits

    digits.bundled_digits.cache_clear()
    with torch.device("meta"):
        Digits().example_batch(2)
    x, y = Digits().train_dataset()[0]
    assert x.device.type == "cpu" and y.device.type == "cpu" and 0.0 <= x.min() and x.max() <= 1.0 and x.sum() > 0


def test_stdlib_text_test_split_is_its_own_files():
    d = StdlibText(max_bytes=400_000, block_size=16)
    train, val, test = (s.tokens for s in (d.train_dataset(), d.val_dataset(), d.test_dataset()))
    total = len(train) + len(val) + len(test)
    assert 0.03 < len(test) / total < 0.3 and total <= 400_000
    assert StdlibText(max_bytes=400_000, block_size=16, test_percent=0).test_dataset() is None
    assert torch.equal(StdlibText(max_bytes=400_000, block_size=16, test_percent=0).val_dataset().tokens, val)


def test_loader_resumes_mid_epoch():
    d = Digits(batch_size=100)
    strategy = SingleDeviceStrategy()
    loader = build_loader(d, strategy, "train", seed=5)
    loader.sampler.set_epoch(3)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    rest = [y.tolist() for _, y in it]
    again = build_loader(d, strategy, "train", seed=5)
    again.load_state_dict(state)
    again.sampler.set_epoch(3)
    assert [y.tolist() for _, y in again] == rest
    rng = torch.get_rng_state()
    list(build_loader(d, strategy, "val", seed=5))
    assert torch.equal(rng, torch.get_rng_state())  # loaders never draw from the global RNG
