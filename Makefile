# Two commands do all set-up on a fresh machine: `make train` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch, installed before the package so its version range is already met, from the index pip is
# configured with (pip.conf, PIP_INDEX_URL): which build that is depends on the index (the default
# index's Linux wheel is the multi-GB CUDA build). TORCH_PIP_ARGS: pip arguments for that one install
# (the user's own, for an index of their choosing).
TORCH_VERSION ?= 2.13.0
TORCH_PIP_ARGS ?=
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup bytecode train lint test test-fast reference docs docs-serve test-xla test-floor gpu-check gpu-bundle bench clean

# $(call install_venv,DIR,TORCH,PACKAGE): a virtual environment with torch installed first (TORCH:
# pip arguments), then the framework (PACKAGE: pip arguments after -e).
define install_venv
	$(PYTHON) -m venv $(1)
	$(1)/bin/pip install -q --upgrade pip
	$(1)/bin/pip install -q $(2)
	$(1)/bin/pip install -q -e $(3)
	touch $(1)/bin/.installed
endef

$(BIN)/.installed: pyproject.toml
	$(call install_venv,$(VENV),$(TORCH_PIP_ARGS) torch==$(TORCH_VERSION),".[dev]")

setup: $(BIN)/.installed

train: setup
	$(BIN)/python train.py $(ARGS)

# The linter (rules in pyproject.toml [tool.ruff]); CI runs it before the tests.
lint: setup
	$(BIN)/ruff check framework tests benchmarks examples hydra_plugins docs/_hooks train.py setup.py

# Four pytest-xdist workers, a file's tests together on one (tests/conftest.py says why). On the
# 2-core machine both cores stay busy through the whole suite with four (18.5 to 23.6 min on
# 2026-11-30 by the hour, one torch thread a process: tests/conftest.py); TEST_WORKERS=0 runs it in
# this process, one at a time.
TEST_WORKERS ?= 4

# DeepSpeed's CPU ops (shared-memory comm, NVMe's async_io) compiled once per environment as part of
# the set-up, into the environment's own folder: torch names its default cache by Python version only,
# so .venv (torch 2.13) and .venv-xla (torch 2.9) sharing it rebuilt each other's ops, and a first
# build inside the suite cost one worker minutes.
OPS_DIR = $(abspath $(VENV))/torch_extensions
XLA_OPS_DIR = $(abspath $(XLA_VENV))/torch_extensions

$(OPS_DIR)/.built: $(BIN)/.installed
	TORCH_EXTENSIONS_DIR=$(OPS_DIR) $(BIN)/python -m tests.helpers.deepspeed_ops
	touch $@

# The project's own modules compiled ahead (up to date: a third of a second), also where
# PYTHONDONTWRITEBYTECODE is set: the suite starts hundreds of interpreters, each of which would
# otherwise compile the ~160 modules it imports (0.36 s of CPU for all 276 on the 2-core machine).
# A module edited since is compiled afresh by Python as usual.
bytecode: setup
	$(BIN)/python -m compileall -q -j 0 framework hydra_plugins tests benchmarks train.py

test: export TORCH_EXTENSIONS_DIR = $(OPS_DIR)
test: setup $(OPS_DIR)/.built bytecode
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder --durations=15 $(PYTEST_ARGS)

# The inner loop: the tests not marked slow (multi-process and end-to-end runs left out).
test-fast: export TORCH_EXTENSIONS_DIR = $(OPS_DIR)
test-fast: setup $(OPS_DIR)/.built bytecode
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder -m "not slow" --durations=5 $(PYTEST_ARGS)

# The pages of the manual generated from the code (framework/reference): the config reference, the
# support matrix (it reruns the pre-launch checks of every strategy x precision and collects the
# tests marked `matrix`: about two minutes) and the keys the docs' prose may name. Committed;
# tests/docs/test_reference.py fails when one is stale.
reference: setup
	$(BIN)/python -m framework.reference

# The documentation site from docs/ (mkdocs.yml): strict, so a broken link or anchor, a page missing
# from the navigation, a navigation entry without a page, or a config key, option or path named in
# the prose that does not exist (docs/_hooks/claims.py) fails the build, naming the page and line.
# Its own environment holds the `docs` extra alone, no torch: the generated pages are committed and
# the API reference is read from the source (docs/_hooks/extra.py lists the extra from pyproject.toml).
# NO_MKDOCS_2_WARNING: the theme's banner about its successor, printed at every build.
DOCS_VENV ?= .venv-docs
DOCS_BIN := $(DOCS_VENV)/bin

$(DOCS_BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_BIN)/pip install -q --upgrade pip
	$(DOCS_BIN)/python docs/_hooks/extra.py docs > $(DOCS_VENV)/requirements.txt
	$(DOCS_BIN)/pip install -q -r $(DOCS_VENV)/requirements.txt
	touch $@

docs: $(DOCS_BIN)/.installed
	NO_MKDOCS_2_WARNING=1 $(DOCS_BIN)/mkdocs build --strict

docs-serve: $(DOCS_BIN)/.installed
	NO_MKDOCS_2_WARNING=1 $(DOCS_BIN)/mkdocs serve

# The XLA family (accelerator=xla, strategy=single_xla/xla_spmd/xla_fsdp, checkpoint_io=xla,
# cluster=xla) on the CPU through PJRT. torch-xla 2.9.0 needs torch 2.9.0 exactly, so it has an
# environment of its own (about 7 GB: that torch build carries CUDA libraries).
XLA_VENV ?= .venv-xla
XLA_BIN := $(XLA_VENV)/bin
XLA_TORCH_VERSION ?= 2.9.0

$(XLA_BIN)/.installed: pyproject.toml
	$(call install_venv,$(XLA_VENV),torch==$(XLA_TORCH_VERSION) torch-xla==$(XLA_TORCH_VERSION),".[xla-test]")

test-xla: $(XLA_BIN)/.installed
	PJRT_DEVICE=CPU $(XLA_BIN)/python -m pytest tests/xla $(PYTEST_ARGS)

# The lowest torch pyproject.toml accepts (torch>=2.9): every strategy that runs on the CPU, a few
# steps at two processes and one resume, in .venv-xla (its torch is that floor) with the DeepSpeed
# and fairscale extras added; CI runs it after test-xla.
$(XLA_BIN)/.floor-installed: $(XLA_BIN)/.installed pyproject.toml
	$(XLA_BIN)/pip install -q -e ".[floor-test]"
	touch $@

test-floor: export TORCH_EXTENSIONS_DIR = $(XLA_OPS_DIR)
test-floor: $(XLA_BIN)/.floor-installed
	FRAMEWORK_FLOOR_SMOKE=1 $(XLA_BIN)/python -m pytest tests/floor $(PYTEST_ARGS)

# The GPU check (not part of `make test`): every strategy x precision x checkpoint_io that makes
# sense on CUDA, at 1 GPU and at all of them, losses compared with the CPU's; writes
# benchmarks/results/gpu_check.md. Its environment installs torch with pip's own configuration
# (pip.conf, PIP_INDEX_URL); GPU_TORCH_PIP_ARGS adds pip arguments for that one install where the
# configured source serves only CPU builds (an index that serves CUDA builds, --no-cache-dir ...).
# Point GPU_PYTHON at a Python that already has a CUDA torch to skip the install.
GPU_VENV ?= .venv-gpu
GPU_PYTHON ?= $(GPU_VENV)/bin/python
GPU_TORCH_PIP_ARGS ?=

$(GPU_VENV)/bin/.installed: pyproject.toml
	$(call install_venv,$(GPU_VENV),$(GPU_TORCH_PIP_ARGS) torch==$(TORCH_VERSION),".[dev]")

gpu-check: $(if $(filter $(GPU_VENV)/bin/python,$(GPU_PYTHON)),$(GPU_VENV)/bin/.installed)
	$(GPU_PYTHON) benchmarks/gpu_check.py $(ARGS)

# For a GPU machine without network that has a CUDA torch: .gpu/ holds what else the framework
# needs, for that machine's Python (GPU_PY_VERSION), to copy with the source tree; there
# `OUT=DIR benchmarks/gpu_session.sh` runs the check under a time limit (docs/gpus.md).
GPU_PY_VERSION ?= 3.12

gpu-bundle: setup
	$(BIN)/python benchmarks/gpu_bundle.py --python-version $(GPU_PY_VERSION) $(ARGS)

# Side-by-side measurements (not tests); results and how to read them: benchmarks/README.md.
# They run in their own environment, which also holds PyTorch Lightning (compared against, never
# a dependency of the framework).
BENCH_VENV ?= .venv-bench
BENCH_BIN := $(BENCH_VENV)/bin
LIGHTNING_VERSION ?= 2.6.6

$(BENCH_BIN)/.installed: pyproject.toml
	$(call install_venv,$(BENCH_VENV),torch==$(TORCH_VERSION),".[dev]" "lightning==$(LIGHTNING_VERSION)")

bench: $(BENCH_BIN)/.installed
	$(BENCH_BIN)/python benchmarks/overhead.py
	$(BENCH_BIN)/python benchmarks/step_overhead.py
	$(BENCH_BIN)/python benchmarks/startup.py
	$(BENCH_BIN)/python benchmarks/ddp_threads.py
	$(BENCH_BIN)/python benchmarks/memory_per_rank.py
	$(BENCH_BIN)/python benchmarks/memory_per_rank.py mesh
	$(BENCH_BIN)/python benchmarks/after_training.py
	$(BENCH_BIN)/python benchmarks/checkpoint_io.py
	$(BENCH_BIN)/python benchmarks/adapters.py "~100M"
	$(BENCH_BIN)/python benchmarks/compile.py
	$(BENCH_BIN)/python benchmarks/pipeline.py
	$(BENCH_BIN)/python benchmarks/moe.py
	$(BENCH_BIN)/python benchmarks/memory_per_rank.py largest --strategies fsdp,pipeline,pipeline_x_fsdp --devices 4
	$(BENCH_BIN)/python benchmarks/fault_tolerance.py
	$(BENCH_BIN)/python benchmarks/data_prep.py
	$(BENCH_BIN)/python benchmarks/nvme_offload.py
	$(BENCH_BIN)/python benchmarks/chunked_loss.py
	$(BENCH_BIN)/python benchmarks/grpo_arithmetic.py
	$(BENCH_BIN)/python benchmarks/grpo_rollout.py
	$(BENCH_BIN)/python benchmarks/front_page.py --run

clean:
	rm -rf $(VENV) $(BENCH_VENV) $(XLA_VENV) $(GPU_VENV) $(DOCS_VENV) outputs multirun .pytest_cache site
