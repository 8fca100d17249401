"""The support matrix's tests: every test marked `pytest.mark.matrix` trains a strategy x precision
cell on the CPU and checks its numbers. The cell comes from the marker's keywords
(`matrix(strategy="single_device", precision="bf16")`; a test may carry several) or else from the
test's parameters named strategy and precision (precision 32 where it has none)."""
from __future__ import annotations

import json
from pathlib import Path


def matrix_cells(items) -> dict[str, list[str]]:
    """{"strategy|precision": [node ids]} of the collected items."""
    cells: dict[str, list[str]] = {}
    for item in items:
        params = item.callspec.params if hasattr(item, "callspec") else {}
        for mark in item.iter_markers("matrix"):
            strategy = mark.kwargs.get("strategy", params.get("strategy"))
            precision = str(mark.kwargs.get("precision", params.get("precision", "32")))
            if strategy is None:
                raise ValueError(f"{item.nodeid}: pytest.mark.matrix names no strategy and the test has no "
                                 "'strategy' parameter")
            cells.setdefault(f"{strategy}|{precision}", []).append(item.nodeid)
    return {cell: sorted(set(ids)) for cell, ids in sorted(cells.items())}


def write_matrix_cells(items, path: str) -> None:
    Path(path).write_text(json.dumps(matrix_cells(items), indent=1))
