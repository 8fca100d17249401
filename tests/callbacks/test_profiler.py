"""callbacks=[profiler]: the chosen steps traced to a file Perfetto and TensorBoard open, a table
of the top operations at the end, every profiling rank its own files."""
from __future__ import annotations

import json

import pytest

from tests.conftest import DIGITS, TINY_GPT, run_inprocess, run_train

PROFILE = ["callbacks=[checkpoint,profiler]", "callbacks.profiler.skip_first=1", "callbacks.profiler.warmup=1",
           "callbacks.profiler.active=2"]


def steps_in(trace) -> list[int]:
    events = json.loads(trace.read_text())["traceEvents"]
    return sorted({int(e["name"].split("#")[1]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")})


def test_the_chosen_steps_are_traced_and_the_top_operations_tabled(tmp_path, capsys):
    out = tmp_path / "run"
    run_inprocess(TINY_GPT + PROFILE + ["trainer.max_steps=6"], out)
    (trace,) = (out / "profiler").glob("rank0.*.pt.trace.json")
    # ProfilerStep#n counts from 0: step 1 skipped, step 2 warm-up, steps 3 and 4 recorded
    assert steps_in(trace) == [2, 3]
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") in ("aten::mm", "aten::addmm") for e in events)
    table = (out / "profiler" / "top_ops_rank0.txt").read_text()
    assert "Self CPU" in table and ("aten::mm" in table or "aten::addmm" in table)
    assert "the operations that took the most time" in capsys.readouterr().out


def test_a_run_too_short_for_the_schedule_says_so(tmp_path, capsys):
    run_inprocess(DIGITS + PROFILE + ["trainer.max_steps=2", "callbacks.profiler.skip_first=5"], tmp_path / "run")
    assert "profiler: no step was recorded (the run took 2 steps; the schedule records from step 7)" \
        in capsys.readouterr().out
    assert not list((tmp_path / "run" / "profiler").glob("*.json"))


@pytest.mark.slow
def test_every_chosen_rank_profiles_under_ddp(tmp_path):
    result = run_train(TINY_GPT + PROFILE + ["trainer.max_steps=4", "strategy=ddp", "devices=2", "name=ddp",
                                              "callbacks.profiler.ranks=[0,1]"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        (trace,) = (tmp_path / "outputs/ddp/profiler").glob(f"rank{rank}.*.pt.trace.json")
        assert steps_in(trace) == [2, 3]
        assert (tmp_path / f"outputs/ddp/profiler/top_ops_rank{rank}.txt").is_file()
