"""docs/architecture.md draws the house's imports (its ```imports block: `a ──> b, c`, paths under
framework/); each arrow must be an import of the module, and every import between the modules the
diagram draws must be drawn, so the picture moves when the code does."""
from __future__ import annotations

import ast
import re

from tests.conftest import ROOT

PACKAGE = ROOT / "framework"


def diagram(text: str) -> dict[str, set[str]]:
    """{module path: the module paths it is drawn importing} of the document's imports block."""
    block = re.search(r"```imports\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no ```imports block"
    drawn: dict[str, set[str]] = {}
    for line in block.group(1).strip().splitlines():
        source, _, targets = line.partition("──>")
        drawn.setdefault(source.strip(), set()).update(t.strip() for t in targets.split(",") if t.strip())
    return drawn


def _path(module: str) -> str | None:
    """framework.a.b as a path under framework/ (a.py, or a package's __init__.py); None: not ours."""
    if not module.startswith("framework."):
        return None
    base = PACKAGE.joinpath(*module.split(".")[1:])
    if base.with_suffix(".py").exists():
        return base.with_suffix(".py").relative_to(PACKAGE).as_posix()
    if (base / "__init__.py").exists():
        return (base / "__init__.py").relative_to(PACKAGE).as_posix()
    return None


def imports(path: str) -> set[str]:
    """The framework modules (as paths under framework/) that framework/<path> imports."""
    found = set()
    for node in ast.walk(ast.parse((PACKAGE / path).read_text())):
        if isinstance(node, ast.Import):
            found.update(_path(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(_path(node.module))
            found.update(_path(f"{node.module}.{alias.name}") for alias in node.names)  # a submodule imported by name
    return {p for p in found if p and p != path}


def problems(drawn: dict[str, set[str]]) -> list[str]:
    every = set(drawn) | set().union(*drawn.values())
    found = []
    for source, targets in drawn.items():
        if not (PACKAGE / source).exists():
            found.append(f"{source}: no such module")
            continue
        actual = imports(source)
        found += [f"{source} ──> {t}: drawn, but it does not import it" for t in sorted(targets - actual)]
        found += [f"{source} ──> {t}: imports it, but the diagram does not draw it"
                  for t in sorted((actual & every) - targets)]
    return found


def test_the_house_is_drawn_as_it_imports():
    assert problems(diagram((ROOT / "docs" / "architecture.md").read_text())) == []


def test_an_arrow_the_code_does_not_have_or_lacks_is_found():
    drawn = diagram((ROOT / "docs" / "architecture.md").read_text())
    wrong = {**drawn, "strategy/mesh/dims.py": drawn["strategy/mesh/dims.py"] | {"strategy/mesh/placement.py"}}
    assert problems(wrong) == ["strategy/mesh/dims.py ──> strategy/mesh/placement.py: drawn, but it does not import it"]
    missing = {**drawn, "tasks/base.py": drawn["tasks/base.py"] - {"batch_split.py"}}
    assert problems(missing) == ["tasks/base.py ──> batch_split.py: imports it, but the diagram does not draw it"]
