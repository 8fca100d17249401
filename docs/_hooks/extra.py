"""Print the requirements of one extra of pyproject.toml, one a line, as a requirements file holds
them (`make docs` installs the `docs` extra alone with them: the site needs no torch). Standard
library only."""
from __future__ import annotations

import re
import sys
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def extra(name: str, text: str) -> list[str]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the one line of the extra, read as written
        line = re.search(rf"^{re.escape(name)} = (\[.*?\])", text, re.M | re.S)
        return re.findall(r'"([^"]+)"', line.group(1)) if line else []
    return tomllib.loads(text)["project"]["optional-dependencies"].get(name, [])


if __name__ == "__main__":
    found = extra(sys.argv[1], PYPROJECT.read_text())
    if not found:
        sys.exit(f"pyproject.toml has no extra '{sys.argv[1]}'")
    print("\n".join(found))
