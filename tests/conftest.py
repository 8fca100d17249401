"""Shared helpers: compose the real config tree, run the real runner, read checkpoints."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

# One torch thread a process, in the test processes and every process they start (as torchrun gives
# its workers): the suite runs four pytest workers, and their runs' workers, on two cores, where a
# second thread a process only waited its turn (test-fast took 19% more CPU and 18% more time with
# two, 2026-11-30). Set before torch starts its thread pool; a value of the user's is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import framework  # noqa: F401  (registers the schema)
from framework.config.overrides import normalize_overrides
from framework.launch import elastic

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
# tests/xla run in .venv-xla (`make test-xla`: torch_xla pins its own torch); elsewhere they are not
# collected at all rather than reported as skipped
collect_ignore = [] if importlib.util.find_spec("torch_xla") else ["xla"]
# Two folders of the test session's, made in the process that starts the xdist workers, which inherit
# them (as does every process a test starts; none of those makes its own): prepared data (data=text_files,
# chat_files) of runs that name no data.cache_dir, never the user's ~/.cache; trained runs shared by every
# test of the session, on both workers (tests/helpers/run_cache.py)
SESSION_FOLDERS = {"FRAMEWORK_DATA_CACHE": "framework-data-cache-", "FRAMEWORK_TEST_RUNS": "framework-test-runs-"}
MADE_HERE = [name for name in SESSION_FOLDERS if name not in os.environ]
for name in MADE_HERE:
    os.environ[name] = tempfile.mkdtemp(prefix=SESSION_FOLDERS[name])
# runs launched from this process (run_command, in_process=True) fork their workers from one
# forkserver for the whole session: it imports once what many of those workers would each import
# (LoRA runs peft, Hugging Face models transformers, classifiers with metrics torchmetrics)
elastic.EXTRA_PRELOAD += ["torchmetrics", "transformers", "peft"]
# tests/floor: every strategy a few steps and a resume, under the lowest torch pyproject accepts
# (`make test-floor`, in .venv-xla's torch 2.9); the main suite covers the same under the pinned one
if not os.environ.get("FRAMEWORK_FLOOR_SMOKE"):
    collect_ignore.append("floor")

# `make test` runs the suite on pytest-xdist workers (Makefile TEST_WORKERS), a test file's tests on
# one worker (its module fixtures built once). Workers beyond the cores fill the waits of
# multi-process tests (the cores stayed busy throughout on 2026-11-29). The slowest files go first so
# that the workers end together (within half a minute of each other that day)
# (worker-seconds per file on the 2-core machine, 2026-11-29, three workers: 305, 300, 223, 192, 146,
# 139, 138, 119, 115, 97, 90, 89, 75, 73, 71, 68, ...; DeepSpeed's op builds are make test's set-up,
# not a test's). The order changes only the wall time, never a result.
SLOWEST_FIRST = (
    "fault_tolerance/test_torchft.py", "recipes/test_recipes.py", "construction/test_compile.py", "test_gpu_check.py",
    "cluster/test_slurm.py", "test_docs.py", "strategy/test_pipeline.py", "test_error_table.py",
    "strategy/test_equivalence.py", "strategy/test_expert_parallel.py", "extension/test_plugin_package.py",
    "checkpoint/test_portable.py", "strategy/test_multiprocess.py", "test_sweeps.py", "strategy/test_model_parallel.py",
    "cli/test_trained_run.py", "cli/test_plan.py", "precision/test_quantized.py", "strategy/test_nvme_offload.py",
    "strategy/test_resume_two_ranks.py", "data/test_store.py", "loop/test_preemption.py", "faults/test_hung_rank.py",
    "test_your_model_doc.py", "adapter/test_lora.py", "recipes/test_hf_recipe.py", "test_train_e2e.py",
    "config/test_compose.py", "checkpoint/test_faults.py", "faults/test_disk_full.py", "cluster/test_mpi.py",
    "loop/test_resume.py",
)


def pytest_sessionfinish(session):
    """The process that made the shared folders removes them (a worker's session ends first)."""
    if not hasattr(session.config, "workerinput"):
        import shutil

        for name in MADE_HERE:
            shutil.rmtree(os.environ[name], ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """FRAMEWORK_TEST_TIMELINE=<file>: each test's start and end (wall clock) and its worker appended
    there, to see where a suite's workers idle or end apart (how SLOWEST_FIRST was ordered)."""
    timeline = os.environ.get("FRAMEWORK_TEST_TIMELINE")
    start = time.time()
    yield
    if timeline:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(timeline, "a") as f:
            f.write(f"{worker}\t{start:.2f}\t{time.time():.2f}\t{item.nodeid}\n")


def pytest_collection_finish(session):
    """FRAMEWORK_MATRIX_CELLS=<file>: the support matrix's tests written there by cell
    (framework/reference/pages.py collects them for docs/reference/support-matrix.md)."""
    if os.environ.get("FRAMEWORK_MATRIX_CELLS"):
        from tests.helpers.matrix import write_matrix_cells

        write_matrix_cells(session.items, os.environ["FRAMEWORK_MATRIX_CELLS"])


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}

    def position(item):
        path = Path(str(item.fspath)).relative_to(ROOT / "tests").as_posix()
        return rank.get(path, len(rank))

    items.sort(key=position)  # stable: the rest keep their collection order


# A model and corpus small enough that a step takes milliseconds. No figure at the end of these
# runs (half a second each, hundreds of runs): tests/plotting checks the figures.
TINY_GPT = [
    "model.n_layer=1", "model.n_embd=32", "model.n_head=2", "model.block_size=32",
    "data.max_bytes=300000", "data.batch_size=8", "data.val_batch_size=32",
    "trainer.val_batches=2", "trainer.log_every=2", "trainer.progress_bar=false", "trainer.plot=false",
]
DIGITS = ["model=mlp", "data=digits", "task=classification", "model.dropout=0.0",
          "trainer.progress_bar=false", "trainer.log_every=5", "trainer.plot=false"]


def compose_cfg(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose(config_name="train", overrides=normalize_overrides(overrides))


def run_inprocess(overrides: list[str], output_dir: Path):
    """framework.run exactly as train.py calls it, on a composed config, in this process."""
    return framework.run(compose_cfg(overrides), output_dir=output_dir)


def run_train(args: list[str], cwd: Path, timeout: int = 300, env: dict | None = None):
    """`python train.py ARGS` as a user types it, from `cwd` (run directories land there)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def checkpoints(output_dir: Path) -> list[Path]:
    return sorted(p for p in (output_dir / "checkpoints").iterdir() if p.name.startswith("step_"))


def checkpoint_at(output_dir: Path, step: int) -> Path:
    return next(c for c in checkpoints(output_dir) if c.name == f"step_{step:06d}")


def metric_values(output_dir: Path, key: str = "train/loss") -> list[float]:
    """Every logged value of `key` in a run's metrics.csv, in step order."""
    import csv

    with open(output_dir / "metrics.csv") as f:
        return [float(row[key]) for row in csv.DictReader(f) if row.get(key)]


def assert_close_metrics(run: Path, reference: Path, keys, steps: int, tol: float = 1e-5) -> None:
    """Every logged value of each of `keys` in `run` (`steps` of them) is `reference`'s, within `tol`."""
    import torch

    for key in keys:
        values = metric_values(run, key)
        assert len(values) == steps, key
        torch.testing.assert_close(torch.tensor(values), torch.tensor(metric_values(reference, key)), rtol=tol,
                                   atol=tol, msg=key)


def assert_close_weights(reference: Path, ckpt: Path) -> None:
    """A checkpoint's weights are the reference checkpoint's, name for name (float32 rounding)."""
    import torch

    a, b = load_model_state(reference), load_model_state(ckpt)
    assert set(a) == set(b)
    for name, value in a.items():
        torch.testing.assert_close(b[name], value, rtol=1e-5, atol=1e-6, msg=name)


def _load_saved(ckpt: Path, name: str) -> dict:
    """`name` ("model" or "optimizer") as saved, from either layout (a sharded one read whole)."""
    if (ckpt / "state").is_dir():
        from framework.checkpoint_io.dcp_reader import read_full

        return read_full(ckpt / "state", (name,))[name]
    return torch.load(ckpt / f"{name}.pt", weights_only=True)


def load_model_state(ckpt: Path) -> dict:
    return _load_saved(ckpt, "model")


def load_optimizer_state(ckpt: Path) -> dict:
    return _load_saved(ckpt, "optimizer")


def assert_resume_is_exact(base: list[str], tmp_path: Path, steps: int) -> tuple[Path, Path]:
    """`steps` steps straight vs steps/2 + resume=auto + steps/2: the last checkpoints of both hold
    bit-identical model and optimizer state. Returns the two last checkpoints."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_inprocess([*base, f"trainer.max_steps={steps}"], straight)
    run_inprocess([*base, f"trainer.max_steps={steps // 2}"], resumed)
    run_inprocess([*base, f"trainer.max_steps={steps}", "resume=auto"], resumed)
    a, b = checkpoints(straight)[-1], checkpoints(resumed)[-1]
    assert a.name == b.name == f"step_{steps:06d}"
    assert_state_equal(load_model_state(a), load_model_state(b), "model")
    assert_state_equal(load_optimizer_state(a), load_optimizer_state(b), "optimizer")
    return a, b


def assert_state_equal(a, b, path="state"):
    """Bit-exact equality of nested state dicts."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), f"{path} differs"
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{path}: keys {sorted(set(a) ^ set(b))} differ"
        for k in a:
            assert_state_equal(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_state_equal(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


@pytest.fixture
def tiny_gpt():
    return list(TINY_GPT)


@pytest.fixture
def digits():
    return list(DIGITS)


@pytest.fixture
def one_rank_group():
    """A gloo process group of this process alone, for the test's duration: enough to check what
    a strategy wraps or how DTensors are handled without starting processes."""
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """A Hugging Face Llama of random weights (2 layers, width 32, 256 token ids: the byte tokenizer's),
    saved to a directory: model=hf_causal_lm model.config=null model.pretrained=<it>."""
    transformers = pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512)
    transformers.LlamaForCausalLM(config).save_pretrained(root / "base")
    return root / "base"
