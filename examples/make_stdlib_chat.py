"""Writes framework/data/examples/stdlib_chat.jsonl: conversations about the Python standard library,
made from its own docstrings (the example data of data=chat_files and recipe hf_lora_chat).

Each row is {"messages": [{role, content}, ...]}: a question about a function or class and its
answer (its signature and the first paragraph of its docstring); every third conversation first
asks what the module is for, then about one of its names (two turns). Deterministic for a given
Python: modules and names in a fixed order, no randomness.

    python examples/make_stdlib_chat.py            # rewrite the shipped file
    python examples/make_stdlib_chat.py out.jsonl  # write elsewhere
"""
from __future__ import annotations

import importlib
import inspect
import json
import re
import sys
from pathlib import Path

MODULES = ["base64", "bisect", "calendar", "collections", "copy", "csv", "dataclasses", "datetime", "difflib",
           "enum", "fnmatch", "fractions", "functools", "glob", "gzip", "hashlib", "heapq", "html", "inspect",
           "itertools", "json", "math", "operator", "os", "os.path", "pathlib", "pprint", "random", "re", "shlex",
           "shutil", "statistics", "string", "struct", "tarfile", "tempfile", "textwrap", "time", "typing",
           "urllib.parse", "uuid", "zipfile", "zlib"]
MOST_PER_MODULE = 40
MOST_CHARS = 420
OUT = Path(__file__).resolve().parent.parent / "framework" / "data" / "examples" / "stdlib_chat.jsonl"


def first_paragraph(doc: str) -> str:
    paragraph = inspect.cleandoc(doc).split("\n\n")[0]
    text = re.sub(r"\s+", " ", paragraph).strip()
    return text if len(text) <= MOST_CHARS else text[:MOST_CHARS].rsplit(" ", 1)[0] + " ..."


def signature(qualified: str, obj) -> str:
    try:
        return f"{qualified}{inspect.signature(obj)}"
    except (TypeError, ValueError):
        return qualified


def answers(module_name: str):
    """(name, answer) for the module's public functions and classes that have a docstring."""
    module = importlib.import_module(module_name)
    found = []
    for name in sorted(getattr(module, "__all__", None) or dir(module)):
        obj = getattr(module, name, None)
        if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.isclass(obj)):
            continue
        doc = inspect.getdoc(obj)
        if not doc or (getattr(obj, "__module__", module_name) or "").split(".")[0] != module_name.split(".")[0]:
            continue
        kind = "class" if inspect.isclass(obj) else "function"
        found.append((name, f"`{signature(f'{module_name}.{name}', obj)}` is a {kind}: {first_paragraph(doc)}"))
    return found[:MOST_PER_MODULE]


def conversations():
    for module_name in MODULES:
        module_doc = first_paragraph(inspect.getdoc(importlib.import_module(module_name)) or "")
        for i, (name, answer) in enumerate(answers(module_name)):
            question = f"What does {module_name}.{name} do?"
            if i % 3 == 2 and module_doc:
                yield [{"role": "user", "content": f"What is the {module_name} module for?"},
                       {"role": "assistant", "content": f"{module_name}: {module_doc}"},
                       {"role": "user", "content": f"And {name}?"},
                       {"role": "assistant", "content": answer}]
            else:
                yield [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def main(out: Path = OUT) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.dumps({"messages": messages}, ensure_ascii=False) for messages in conversations()]
    out.write_text("\n".join(rows) + "\n", encoding="utf-8")
    print(f"{out}: {len(rows)} conversations, {out.stat().st_size / 1e3:.0f} kB")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
