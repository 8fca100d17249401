"""What a config YAML's comments say, read from its text (a YAML parser drops them): the file's
leading comment (its description: `framework list`, the config reference) and the comment above
each key (the config reference)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w.]*|'[^']+'|\"[^\"]+\"):(?: (?P<value>.*))?$")


@dataclass(frozen=True)
class YamlKey:
    path: str  # dotted, from the file's top level
    value: str  # the value as written ("" for a mapping)
    comment: str  # the comment lines directly above it, joined


def yaml_description(path: Path) -> str:
    """The leading comment of a YAML file, as one line (a `# @package` line left out)."""
    lines = []
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped.startswith("#"):
            break
        text = stripped.lstrip("#").strip()
        if not text.startswith("@package"):
            lines.append(text)
    return " ".join(lines)


def yaml_keys(path: Path) -> list[YamlKey]:
    """Every key of the file in order, nested ones with their dotted path. A comment belongs to the
    key on the line after it; the file's leading comment (its description) belongs to none."""
    keys: list[YamlKey] = []
    stack: list[tuple[int, str]] = []  # (indent, key) of the open mappings
    comment: list[str] = []
    leading = True
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            if not leading:
                comment.append(stripped.lstrip("#").strip())
            continue
        if not stripped:
            comment = []
            leading = False
            continue
        leading = False
        match = _KEY.match(line)
        if not match:  # a list item or a continuation line
            comment = []
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = match["key"].strip("'\"")
        dotted = ".".join([k for _, k in stack] + [key])
        value = (match["value"] or "").split(" #")[0].strip()
        keys.append(YamlKey(dotted, value, " ".join(comment)))
        comment = []
        if not value:
            stack.append((indent, key))
    return keys
