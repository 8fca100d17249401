"""The files a run's scores leave beside it: test_metrics.json, and the metrics printed as a table."""
from __future__ import annotations

import json
from pathlib import Path

TEST_METRICS_FILE = "test_metrics.json"


def write_json(path: Path, record: dict) -> Path:
    """Written whole or not at all (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def test_record(tested: dict, **context) -> dict:
    """What test_metrics.json holds: the metrics, the checkpoint they score (and why it was
    chosen), and how they were computed (strategy, precision, world size, ...)."""
    return {"metrics": tested["metrics"], "checkpoint": tested.get("checkpoint"), "step": tested.get("step"),
            "chosen": tested.get("chosen"), **context}


def metrics_table(metrics: dict[str, float], title: str) -> str:
    """The metrics as an aligned two-column table, names sorted."""
    width = max([len("metric"), *map(len, metrics)])
    lines = [title, f"  {'metric':<{width}}  value", f"  {'-' * width}  {'-' * 12}"]
    lines += [f"  {name:<{width}}  {value:.6g}" for name, value in sorted(metrics.items())]
    return "\n".join(lines)


PREDICTION_FORMATS = (".jsonl", ".parquet")


def merge_predictions(parts: list[Path], out: Path) -> int:
    """The rows every rank wrote (JSON lines with an `index`), in data-set order, as one file:
    JSON lines, or parquet (needs pyarrow). Returns the number of rows."""
    rows = []
    for part in parts:
        with open(part, encoding="utf-8") as f:
            rows += [json.loads(line) for line in f if line.strip()]
    rows.sort(key=lambda row: row["index"])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    if out.suffix == ".parquet":
        import pyarrow
        import pyarrow.parquet

        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), tmp)
    else:
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    tmp.replace(out)
    return len(rows)
