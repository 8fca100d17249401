"""Which generated page is written from what (one list: `make reference` writes them, the
staleness test compares them)."""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from framework.reference import config_page, support_matrix

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
PLUGIN_ROOT = ROOT / "examples" / "plugin"
PLUGIN_CONF = [PLUGIN_ROOT / "framework_plugin_example" / "conf"]
GPU_RESULTS = ROOT / "benchmarks" / "results" / "gpu_check.md"
CONFIG_PAGE = ROOT / "docs" / "reference" / "config.md"
KNOWN_KEYS = ROOT / "docs" / "_hooks" / "known_keys.json"
MATRIX_PAGE = ROOT / "docs" / "reference" / "support-matrix.md"


def collected_matrix_tests() -> dict[tuple[str, str], list[str]]:
    """The tests marked `matrix`, by (strategy, precision): collected by pytest in a child process
    (tests/conftest.py writes them where FRAMEWORK_MATRIX_CELLS says)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "cells.json"
        result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                 "-m", "matrix"], cwd=ROOT, capture_output=True, text=True,
                                env={**os.environ, "FRAMEWORK_MATRIX_CELLS": str(out)})
        if not out.is_file():
            raise RuntimeError(f"collecting the tests failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
        return {tuple(cell.split("|")): tests for cell, tests in json.loads(out.read_text()).items()}


def matrix_page(tested: dict[tuple[str, str], list[str]]) -> str:
    options = config_page.group_options(CONF)
    strategies = [p.stem for p in options["strategy"]]
    strategies = ["single_device", *(s for s in strategies if s not in ("single_device", "auto"))]
    precisions = support_matrix.ordered_precisions([p.stem for p in options["precision"]])
    cpu = support_matrix.cpu_cells(CONF, strategies, precisions)
    where, gpu = support_matrix.gpu_cells(GPU_RESULTS)
    return support_matrix.render(cpu, tested, where, gpu, strategies, precisions)


@contextlib.contextmanager
def _plugin_importable():
    """The example plugin's classes importable while its options are read: their signatures decide
    which keys are open, and whether a test had installed it must not change the page."""
    sys.path.insert(0, str(PLUGIN_ROOT))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path.remove(str(PLUGIN_ROOT))


def generated(tested: dict[tuple[str, str], list[str]] | None = None, matrix: bool = True) -> dict[Path, str]:
    """{path: text} of every generated file; `tested`: the matrix tests, collected when not given;
    matrix=False leaves the support matrix out (it runs the pre-launch checks of ~200 cells)."""
    pages = {
        CONFIG_PAGE: config_page.render(CONF, ROOT),
    }
    with _plugin_importable():
        pages[KNOWN_KEYS] = json.dumps(config_page.known_keys(CONF, PLUGIN_CONF), indent=1) + "\n"
    if matrix:
        pages[MATRIX_PAGE] = matrix_page(collected_matrix_tests() if tested is None else tested)
    return pages
