"""Writes the toy task of recipes grpo_arithmetic_sft and grpo_arithmetic (framework/data/examples/):
adding two numbers below 100, with a verifiable answer.

- arithmetic_sft.txt: "a+b=c" lines a language model is first taught (data=text_files, a line each);
- arithmetic_prompts.jsonl: {"prompt": "a+b=", "answer": "c"} rows GRPO samples completions for;
- arithmetic_test.jsonl: rows of the same shape that neither stage trains on (`framework test`).

Every one of the 10,000 sums goes to one file by a hash of its text (30% taught, 20% prompted, 5%
tested, the rest unused), so no test sum is seen in training. Deterministic, no randomness.

    python examples/make_arithmetic.py          # rewrite the shipped files
    python examples/make_arithmetic.py OUTDIR   # write elsewhere
"""
from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "framework" / "data" / "examples"
SHARES = (("sft", 30), ("prompts", 20), ("test", 5))  # percent of the sums, by hash


def bucket(a: int, b: int) -> str | None:
    cut, at = zlib.crc32(f"{a}+{b}".encode()) % 100, 0
    for name, share in SHARES:
        if cut < at + share:
            return name
        at += share
    return None


def main(out: Path = OUT) -> None:
    out.mkdir(parents=True, exist_ok=True)
    found: dict[str, list[tuple[int, int]]] = {name: [] for name, _ in SHARES}
    for a in range(100):
        for b in range(100):
            name = bucket(a, b)
            if name is not None:
                found[name].append((a, b))
    (out / "arithmetic_sft.txt").write_text("".join(f"{a}+{b}={a + b}\n" for a, b in found["sft"]))
    for name in ("prompts", "test"):
        with open(out / f"arithmetic_{name}.jsonl", "w") as f:
            for a, b in found[name]:
                f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")
    print(", ".join(f"{name}: {len(rows)}" for name, rows in found.items()))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
