"""`framework list`: every option of every group, described, with whether it runs here."""
from __future__ import annotations

import re

import pytest
import torch

from framework.accelerator.cpu import CPUAccelerator
from framework.cli.list_options import check_usable, discover
from tests.cli.helpers import framework_cmd
from tests.conftest import CONF


def test_every_shipped_option_is_listed_with_a_description():
    options = discover()
    listed = {(o.group, o.name) for o in options}
    for path in CONF.rglob("*.yaml"):
        group = path.parent.relative_to(CONF).as_posix()
        if group != ".":
            assert (group, path.stem) in listed
    assert {o.name for o in options if o.group == "recipes"} >= {
        "digits_classifier", "digits_sweep_optuna", "gpt_ddp", "gpt_fsdp", "gpt_deepspeed_stage_3_offload", "gpt_bf16"}
    assert all(o.description for o in options), [o.name for o in options if not o.description]


@pytest.mark.parametrize("fast_fp16", [False, True], ids=["cpu-without-fp16", "cpu-with-fp16"])
@pytest.mark.parametrize("fast_bf16", [pytest.param(False, marks=pytest.mark.slow), True],  # every group: make test
                         ids=["without-bf16", "with-bf16"])
def test_usability_follows_the_compatibility_table(monkeypatch, fast_fp16, fast_bf16):
    # every kind of CPU this project's machines have, whichever this one is (the code's own predicates)
    monkeypatch.setattr(CPUAccelerator, "fast_fp16", lambda self: fast_fp16)
    monkeypatch.setattr(CPUAccelerator, "fast_bf16", lambda self: fast_bf16)
    # the CPU's fp16/bf16 predicates are read by the precision options alone: the other groups once
    every_group = not fast_fp16 and not fast_bf16  # a slow case (about 50 options composed and prepared)
    options = list(discover(["accelerator", "strategy", "precision", "logger"] if every_group else ["precision"]))
    check_usable(options)
    by_name = {(o.group, o.name): o for o in options}
    if every_group:
        assert by_name["accelerator", "cpu"].problem is None
        assert (by_name["accelerator", "cuda"].problem is None) == torch.cuda.is_available()
        if not torch.cuda.is_available():
            assert "accelerator=cuda" in by_name["accelerator", "cuda"].problem
            assert "needs CUDA" in by_name["strategy", "fairscale_fsdp"].problem
        assert by_name["strategy", "deepspeed_stage_3"].problem is None  # deepspeed is installed by the dev extra
        assert by_name["logger", "mlflow"].problem is None and by_name["logger", "tensorboard"].problem is None
    fp16 = by_name["precision", "16"]
    assert fp16.problem is None
    if fast_fp16:
        assert "fp16" not in fp16.note
    else:
        assert "no fp16 hardware" in fp16.note and "slower" in fp16.note
        assert ("precision=bf16 is the fast mixed precision here" in fp16.note) == fast_bf16
    bf16 = by_name["precision", "bf16"]
    assert bf16.problem is None and ("no bf16 hardware" in bf16.note) != fast_bf16


def test_list_command_for_one_group_and_a_typo():
    result = framework_cmd("list", "strategy")
    assert result.returncode == 0, result.stderr
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^  (\w+)\s+(yes|no)\b", result.stdout, re.M)}
    assert rows["ddp"] == "yes" and rows["fsdp"] == "yes" and len(rows) == len(list((CONF / "strategy").glob("*.yaml")))
    assert not re.search(r"^accelerator$", result.stdout, re.M)  # only the group asked for
    typo = framework_cmd("list", "stratgy")
    assert typo.returncode == 2 and "Did you mean strategy?" in typo.stderr and "Traceback" not in typo.stderr
