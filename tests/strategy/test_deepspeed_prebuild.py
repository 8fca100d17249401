"""`python -m framework.strategy.deepspeed.prebuild` names ops DeepSpeed's CPU accelerator has, and
leaves out one it cannot build with the reason (`make test`'s set-up runs it for real)."""
from __future__ import annotations

import os

import pytest

from framework.strategy.deepspeed import prebuild


def test_every_op_it_builds_is_one_of_deepspeeds_cpu_ops(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", os.environ.get("DS_ACCELERATOR", "cpu"))
    prebuild.deepspeed_package()
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":  # this process chose another accelerator before
        pytest.skip(f"DeepSpeed's accelerator in this process is {get_accelerator().device_name()}, not the CPU's")
    names = {get_accelerator().create_op_builder(name).NAME for name in prebuild.CPU_OPS}
    assert names == {"deepspeed_shm_comm", "async_io", "pin_memory"}


def test_an_op_that_cannot_be_built_is_left_out_with_the_reason(monkeypatch):
    from deepspeed.accelerator import get_accelerator

    builder_class = type(get_accelerator().create_op_builder("AsyncIOBuilder"))
    monkeypatch.setattr(builder_class, "is_compatible", lambda self, verbose=False: False)
    monkeypatch.setattr(builder_class, "load", lambda self, verbose=False: (_ for _ in ()).throw(AssertionError))
    assert prebuild.build(("AsyncIOBuilder", "NoSuchBuilder")) == [
        ("async_io", "left out: its system library is missing (libaio-dev for the NVMe ops)"),
        ("NoSuchBuilder", f"not an op of DeepSpeed's {get_accelerator().device_name()} accelerator")]


def test_an_op_that_fails_to_compile_is_said_and_the_others_still_build(monkeypatch, capsys):
    from deepspeed.accelerator import get_accelerator

    def broken(self, verbose=False):
        raise RuntimeError("Error building extension 'async_io'\nninja: build stopped: subcommand failed.")

    builders = {name: type(get_accelerator().create_op_builder(name)) for name in ("AsyncIOBuilder", "PinMemoryBuilder")}
    for builder in builders.values():
        monkeypatch.setattr(builder, "is_compatible", lambda self, verbose=False: True)
    monkeypatch.setattr(builders["AsyncIOBuilder"], "load", broken)
    monkeypatch.setattr(builders["PinMemoryBuilder"], "load", lambda self, verbose=False: None)
    monkeypatch.setattr(prebuild, "CPU_OPS", ("AsyncIOBuilder", "PinMemoryBuilder"))
    assert prebuild.main([]) == 1
    said = capsys.readouterr().out
    assert "async_io: failed: ninja: build stopped: subcommand failed." in said and "pin_memory: ready" in said
