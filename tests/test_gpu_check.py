"""benchmarks/gpu_check.py (`make gpu-check`, and benchmarks/gpu_session.sh around it) checked on the
CPU, so the script is ready the day a GPU is lent: a row that trains, a mixture of experts against
its own reference, a refused one with its reason, a resume compared bit for bit, replica groups
(their heal row's verdict on summaries of its own: tests/fault_tolerance heals groups for real);
every row's global batch; the order under a time limit; and the refusal to run without CUDA."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
SESSION = ROOT / "benchmarks" / "gpu_session.sh"


@pytest.mark.slow
def test_the_gpu_check_runs_its_rows_on_the_cpu(tmp_path):
    # as a lent GPU machine runs it (benchmarks/gpu_session.sh, here with no bundle: this
    # environment has every package), the rows of a machine of one device (`--devices 1`): each row
    # one process, the replica groups two of one (the script's self-check; multi-process runs are
    # checked by tests/strategy and tests/fault_tolerance)
    out = tmp_path / "out"
    result = subprocess.run([str(SESSION), "--accelerator", "cpu", "--devices", "1", "--rows",
                             "single_device/32/torch,ddp/32/dcp,ddp/32/torch/torchft,"
                             "single_device/32/torch/moe,ddp/32/torch/grpo"], capture_output=True, text=True, timeout=900, cwd=tmp_path,
                            env={**os.environ, "OUT": str(out), "GPU_BUNDLE": str(tmp_path / "no-bundle"),
                                 "GPU_PYTHON": sys.executable, "PARALLEL": "1", "BUDGET_S": "880"})
    assert result.returncode == 0, result.stdout + result.stderr
    machine = (out / "machine.txt").read_text()
    # every package the framework needs is found (Lightning is only compared against)
    assert f"torch {torch.__version__}" in machine and "hydra: 1.3." in machine
    assert "MISSING" not in machine.split("lightning:")[0], machine
    assert not (ROOT / "framework" / "conf").exists()  # installed here: nothing linked into the tree
    table = out / "gpu_check.md"
    rows = {tuple(c.strip() for c in line.split("|")[1:6]): [c.strip() for c in line.split("|")[6:-1]]
            for line in table.read_text().splitlines()[4:]}
    outcome, last, diff, _, why = rows[("single_device", "32", "torch", "1", "")]
    # the CPU against itself: two runs of one job, within float32 rounding (bit-equal on an idle
    # machine; 4.8e-07 apart once on an AMX CPU under load, see docs/checkpoints.md, "Reproducibility")
    assert outcome == "ok" and float(diff) < 1e-5
    outcome, last, diff, _, why = rows[("single_device", "32", "torch", "1", "trainer.compile=true")]
    assert outcome == "ok" and float(diff) < 1e-5  # compiled against the eager CPU reference (the same key)
    outcome, last, diff, _, why = rows[("single_device", "32", "torch", "1", "moe")]
    # against a reference of the same mixture of experts (the dense GPT's loss is another)
    assert outcome == "ok" and float(diff) < 1e-5 and abs(float(last) - float(rows[("single_device", "32", "torch", "1",
                                                                                      "")][1])) > 1e-3
    outcome, last, diff, _, why = rows[("ddp", "32", "dcp", "1", "3 steps + resume + 3")]
    assert outcome == "ok, resume exact" and float(diff) < 1e-5  # ddp on 1 = single_device
    # 2 replica groups of 1: their mean loss is the global batch's, on one process
    outcome, last, diff, _, why = rows[("ddp", "32", "torch", "1", "2 replica groups, gloo between")]
    assert outcome == "ok" and float(diff) < 1e-5
    outcome, *_, why = rows[("ddp", "32", "torch", "1", "2 replica groups, nccl between")]
    assert outcome == "refused" and "NCCL joins GPUs" in why
    assert ("ddp", "32", "torch", "1", "group 1 killed after step 3, heals") not in rows  # its own key: torchft-heal
    # GRPO: completions sampled inside the loop, its small loss within its own tolerance of the CPU's
    outcome, last, diff, _, why = rows[("ddp", "32", "torch", "1", "grpo")]
    assert outcome == "ok" and float(diff) < 1e-5


def test_without_cuda_it_says_so(monkeypatch, capsys):
    gpu_check = load_script()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py"])
    assert gpu_check.main() == 2 and "run it on a machine with NVIDIA GPUs" in capsys.readouterr().err


def load_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = gpu_check  # dataclasses look their module up
    spec.loader.exec_module(gpu_check)
    return gpu_check


def test_the_heal_rows_verdict(tmp_path):
    """The killed group must have started twice and healed, and every group end with the same weights."""
    import json

    gpu_check = load_script()
    heal = next(r for r in gpu_check.replica_group_rows(2) if r.heal)
    plain = next(r for r in gpu_check.replica_group_rows(2) if r.groups == 2 and not r.heal)
    assert heal.key == "ddp/32/torch/torchft-heal" and plain.key == "ddp/32/torch/torchft"

    def verdict(row, weights_agree, starts, heals):
        (tmp_path / "summary.json").write_text(json.dumps({"weights_agree": weights_agree, "replica_groups": [
            {"starts": 1}, {"starts": starts, "replicas": {"heals": [{"step": 4}] * heals}}]}))
        return gpu_check.replica_outcome(row, tmp_path)

    assert verdict(heal, True, 2, 1) == ""
    assert verdict(heal, True, 1, 0) == "group 1 started 1 time(s), healed 0 time(s)"
    assert verdict(heal, True, 2, 0) == "group 1 started 2 time(s), healed 0 time(s)"
    assert verdict(heal, False, 2, 1) == "the groups' final weights differ"
    assert verdict(plain, True, 1, 0) == ""  # nobody was killed


def test_a_failed_row_shows_the_exceptions_own_line():
    gpu_check = load_script()
    hydra_wrapped = ("Error executing job with overrides: ['x=1']\nTraceback (most recent call last):\n  File ...\n"
                     "ValueError: use_strided_shard_as_shard_order is True\n")
    assert gpu_check.failure_reason(hydra_wrapped) == "ValueError: use_strided_shard_as_shard_order is True"
    workers = "noise\nerror: worker rank 1 failed first: AttributeError: 'FlatParameter' object\nmore\n"
    assert gpu_check.failure_reason(workers) == "worker rank 1 failed first: AttributeError: 'FlatParameter' object"


DIMS_KEYS = {"pipeline_parallel_size": "pipeline", "data_parallel_size": "data_parallel",
             "tensor_parallel_size": "tensor", "shard_size": "shard", "expert_parallel_size": "expert",
             "context_parallel_size": "context"}


def batch_readers(row) -> int:
    """The ranks of `row` that read their own batch, by the framework's own resolution of its
    strategy's sizes (conf/strategy/<name>.yaml, then the row's overrides)."""
    from omegaconf import OmegaConf

    from framework.strategy.mesh.dims import DimsSettings

    given = {key: value for key, value in OmegaConf.load(ROOT / "conf" / "strategy" / f"{row.strategy}.yaml").items()
             if key in DIMS_KEYS}
    for override in row.extra:
        key, _, value = override.partition("=")
        if key.removeprefix("strategy.") in DIMS_KEYS:
            given[key.removeprefix("strategy.")] = value if value == "auto" else int(value)
    if not given:  # no mesh: every rank its own batch
        return row.devices
    return DimsSettings(**{DIMS_KEYS[key]: value for key, value in given.items()}).resolve(row.devices,
                                                                                           row.devices).data_parallel


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_every_row_trains_its_references_global_batch(gpus):
    """A row's loss is compared with one process's on 8 sequences a device: where ranks split layers
    or stages instead of reading their own batch, each reader's batch must grow to match (model_parallel
    at 4 GPUs once trained a quarter of the reference's batch: tensor parallelism spans the node)."""
    gpu_check = load_script()
    checked = 0
    for row in gpu_check.rows(gpus):
        sizes = [int(o.split("=")[1]) for o in row.extra if o.startswith("data.batch_size=")]
        batch = sizes[-1] if sizes else 8
        assert batch * batch_readers(row) * row.groups == 8 * row.reference_devices, (row.key, row.note, row.extra)
        # the mesh layouts (at 1 GPU each alone, at more spread over them) were among the rows checked
        checked += row.strategy in ("model_parallel", "pipeline") and (row.devices > 1 or gpus == 1)
    assert checked >= 10


def test_the_expert_rows_spread_the_experts_over_the_gpus():
    gpu_check = load_script()
    at4 = {(r.key, r.note): r for r in gpu_check.rows(4) if r.job}
    assert "strategy.expert_parallel_size=4" in at4[("fsdp/32/torch/moe", "moe, experts over 4 rank(s)")].extra
    assert at4[("fsdp/32/dcp/moe", "moe, experts over 4 rank(s), 3 steps + resume + 3")].resume
    pipelined = at4[("model_parallel/bf16/torch/moe", "moe, 2 pipeline stages x experts over 2 rank(s)")]
    assert {"strategy.pipeline_parallel_size=2", "strategy.expert_parallel_size=2"} <= set(pipelined.extra)
    groups = next(r for (key, _), r in at4.items() if key == "fsdp/bf16/torch/torchft/moe")
    assert groups.devices == 2 and "strategy.expert_parallel_size=2" in groups.extra
    assert any(key == "fsdp/bf16/torch/qwen3_moe" for key, _ in at4)
    # its reference trains the same model, on the CPU, at the global batch
    assert gpu_check.reference_key(groups) == (4, "32", "moe")
    assert "model.moe.num_experts=8" in gpu_check.JOBS["moe"]
    assert not any(o.startswith("model.n_") for o in gpu_check.JOBS["qwen3_moe"])  # the GPT's keys are not HF's
    # 6 GPUs: the experts over the ranks that divide them
    assert "strategy.expert_parallel_size=2" in next(r for r in gpu_check.rows(6) if r.key == "fsdp/32/torch/moe").extra


def run_main(gpu_check, monkeypatch, tmp_path, *argv, broken_job=None, broken_row=None):
    """gpu_check.main() with each row's run and reference replaced by a stand-in (the reference of
    `broken_job` failing; the script's check raising on the row whose note is `broken_row`): the rows
    in the order they started, and the exit status."""
    started, out = [], Path(argv[argv.index("--out") + 1]) if "--out" in argv else None

    def reference_losses(key, *args, **kwargs):
        if key[2] == broken_job:
            raise RuntimeError(f"the CPU reference ({key[2]}) failed: ImportError: no transformers")
        return [5.0, 4.0]

    def check(row, accelerator, reference, workdir):
        if out is not None and started:  # what a run killed now would leave: the rows ended so far
            assert out.read_text().count("| ok |") == len(started) and "In progress" in out.read_text()
        started.append(row.identity)
        if row.note == broken_row:
            raise KeyError("train/loss")
        return {"result": "ok", "last": 4.0, "diff": 0.0, "seconds": 0, "why": ""}

    monkeypatch.setattr(gpu_check, "reference_losses", reference_losses)

    monkeypatch.setattr(gpu_check, "check", check)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--accelerator", "cpu", "--devices", "1", *argv])
    return started, gpu_check.main()


def test_rows_a_gpu_has_not_passed_run_first_and_a_deadline_ends_the_run_with_its_table(monkeypatch, tmp_path):
    gpu_check = load_script()
    every = gpu_check.rows(1)
    before = tmp_path / "before.md"  # a published table: the dense single_device rows ok, one FAILED
    before.write_text("header\n\n| strategy | precision | checkpoint_io | devices | note | result | last loss | vs CPU | "
                      "seconds | why |\n|---|---|---|---|---|---|---|---|---|---|\n"
                      + "".join(f"| {' | '.join(r.identity)} | {'FAILED (exit 1)' if r.precision == '16' else 'ok'} "
                                f"| 4.0 | 0.0 | 1 | |\n" for r in every if r.key.startswith("single_device/") and not r.job))
    assert gpu_check.ran_before(before) >= {("single_device", "32", "torch", "1", "")}
    merged = tmp_path / "merged.md"  # two runs' table: the note says which run a row's result is from
    merged.write_text("| fsdp | 16 | torch | 1 | run 2 (run 1: FAILED (exit 1)) | ok | 5.0 | 0.0 | 16 |  |\n"
                      "| hsdp | bf16 | torch | 1 | trainer.compile=true; run 2 (run 1: not reached) | ok | 5.0 | 0.0 | 33 |  |\n")
    assert gpu_check.ran_before(merged) == {("fsdp", "16", "torch", "1", ""),
                                            ("hsdp", "bf16", "torch", "1", "trainer.compile=true")}
    table = tmp_path / "table.md"
    keys = "single_device/32/torch,single_device/16/torch,single_device/32/torch/moe"
    started, status = run_main(gpu_check, monkeypatch, tmp_path, "--rows", keys, "--before", str(before), "--out",
                               str(table))
    assert status == 0
    # the MoE rows (never run on a GPU) and the failed float16 row first; the ok ones after
    firsts = {started[0], started[1]}
    assert ("single_device", "16", "torch", "1", "") in firsts and ("single_device", "32", "torch", "1", "moe") in firsts
    assert set(started[2:]) == {("single_device", "32", "torch", "1", ""),
                                ("single_device", "32", "torch", "1", "trainer.compile=true")}
    lines = [line for line in table.read_text().splitlines() if line.startswith("| single_device")]
    assert len(lines) == 4 and "In progress" not in table.read_text()
    # a deadline already past: nothing starts, every row listed as not run, exit 1
    started, status = run_main(gpu_check, monkeypatch, tmp_path, "--rows", keys, "--deadline", "0", "--out",
                               str(table))
    assert started == [] and status == 1
    assert table.read_text().count("not run (deadline)") == 4


def test_an_unknown_row_key_is_refused_with_the_keys_name(monkeypatch, tmp_path, capsys):
    gpu_check = load_script()
    _, status = run_main(gpu_check, monkeypatch, tmp_path, "--rows", "single_device/32/torch,fsdp/64/torch")
    assert status == 2 and "fsdp/64/torch" in capsys.readouterr().err


def test_a_refusal_is_told_from_a_failure_with_its_reason():
    gpu_check = load_script()
    plain = "configuration error: strategy=fairscale_fsdp needs CUDA\n  - use strategy=fsdp\n(set debug=true for more)\n"
    assert gpu_check.refusal(2, plain) == "strategy=fairscale_fsdp needs CUDA use strategy=fsdp"
    # HYDRA_FULL_ERROR=1: the same refusal as a traceback, exit 1
    traced = "Traceback (most recent call last):\n  File ...\nframework.errors.ConfigError: NCCL joins GPUs; use gloo.\n"
    assert gpu_check.refusal(1, traced) == "NCCL joins GPUs; use gloo."
    assert gpu_check.refusal(1, "Traceback ...\nRuntimeError: CUDA error: an illegal memory access\n") is None


def test_a_failed_reference_or_a_row_the_script_cannot_read_loses_no_other_row(monkeypatch, tmp_path):
    gpu_check = load_script()
    table = tmp_path / "table.md"
    started, status = run_main(gpu_check, monkeypatch, tmp_path, "--rows", "single_device/32/torch,single_device/32/"
                               "torch/moe", "--out", str(table), broken_job="moe", broken_row="trainer.compile=true")
    rows = {tuple(c.strip() for c in line.split("|")[1:6]): [c.strip() for c in line.split("|")[6:-1]]
            for line in table.read_text().splitlines()[4:]}
    assert status == 1 and len(rows) == 3
    assert rows[("single_device", "32", "torch", "1", "")][0] == "ok"
    outcome, *_, why = rows[("single_device", "32", "torch", "1", "moe")]
    assert outcome == "NO REFERENCE" and "no transformers" in why
    outcome, *_, why = rows[("single_device", "32", "torch", "1", "trainer.compile=true")]
    assert outcome == "FAILED (gpu_check)" and why == "KeyError: 'train/loss'"
