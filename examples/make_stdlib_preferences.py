"""Writes framework/data/examples/stdlib_preferences.jsonl: preference pairs about the Python standard
library, made from its own docstrings (the example data of data=preference_files and recipe
hf_dpo_chat).

Each row is trl's conversational shape, {"prompt": [user], "chosen": [assistant], "rejected":
[assistant]}: a question about a function or class of a module, its own answer (its signature and
the first paragraph of its docstring: examples/make_stdlib_chat.py) chosen, and the answer of the
next name of the same module rejected, a fluent answer about the wrong thing. Deterministic for a
given Python: modules and names in a fixed order, no randomness.

    python examples/make_stdlib_preferences.py            # rewrite the shipped file
    python examples/make_stdlib_preferences.py out.jsonl  # write elsewhere
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_stdlib_chat import MODULES, answers  # noqa: E402  (a sibling script)

OUT = Path(__file__).resolve().parent.parent / "framework" / "data" / "examples" / "stdlib_preferences.jsonl"


def pairs():
    for module_name in MODULES:
        found = answers(module_name)
        for i, (name, answer) in enumerate(found):
            wrong = found[(i + 1) % len(found)][1]
            if len(found) < 2 or wrong == answer:
                continue
            yield {"prompt": [{"role": "user", "content": f"What does {module_name}.{name} do?"}],
                   "chosen": [{"role": "assistant", "content": answer}],
                   "rejected": [{"role": "assistant", "content": wrong}]}


def main(out: Path = OUT) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.dumps(pair, ensure_ascii=False) for pair in pairs()]
    out.write_text("\n".join(rows) + "\n", encoding="utf-8")
    print(f"{out}: {len(rows)} pairs, {out.stat().st_size / 1e3:.0f} kB")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
