# Two commands do all set-up on a fresh machine: `make train` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch, installed before the package so its version range is already met
# (a bare `torch` requirement on an empty machine pulls a multi-GB CUDA build).
TORCH_VERSION ?= 2.13.0
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup train test bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==$(TORCH_VERSION)
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

setup: $(BIN)/.installed

train: setup
	$(BIN)/python train.py $(ARGS)

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Side-by-side measurements (not tests); results and how to read them: benchmarks/README.md.
# They run in their own environment, which also holds PyTorch Lightning (compared against, never
# a dependency of the framework).
BENCH_VENV ?= .venv-bench
BENCH_BIN := $(BENCH_VENV)/bin
LIGHTNING_VERSION ?= 2.6.6

$(BENCH_BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_BIN)/pip install -q --upgrade pip
	$(BENCH_BIN)/pip install -q torch==$(TORCH_VERSION)
	$(BENCH_BIN)/pip install -q -e ".[dev]" "lightning==$(LIGHTNING_VERSION)"
	touch $@

bench: $(BENCH_BIN)/.installed
	$(BENCH_BIN)/python benchmarks/overhead.py
	$(BENCH_BIN)/python benchmarks/startup.py
	$(BENCH_BIN)/python benchmarks/ddp_threads.py
	$(BENCH_BIN)/python benchmarks/memory_per_rank.py
	$(BENCH_BIN)/python benchmarks/checkpoint_io.py

clean:
	rm -rf $(VENV) $(BENCH_VENV) outputs multirun .pytest_cache
