"""Where every benchmark leaves its table: benchmarks/results/<name>.md, and printed."""
from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def publish(name: str, lines: list[str]) -> str:
    """Write `lines` as benchmarks/results/<name>.md, print them, and return the table."""
    table = "\n".join(lines)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.md").write_text(table + "\n")
    print(table)
    return table
