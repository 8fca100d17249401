"""The layering contract (docs/architecture.md, "Floors"): imports between the framework's own
modules run one way, ground floor first, sit at the top of the file, and form no cycle.

Read from the source with `ast` (nothing is imported), so a violation in a branch that no test
runs is caught too.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "framework"

# Floor of every module, by the longest matching name prefix; a module imports only from its
# own floor or below. Keep in step with docs/architecture.md.
FLOORS = {
    "framework.errors": 0, "framework.version": 0, "framework.console": 0, "framework.tensors": 0,
    "framework.config": 1, "framework.paths": 1, "framework.registry": 1,
    "framework.accelerator": 2, "framework.precision": 2, "framework.checkpoint_io": 2,
    "framework.cluster": 2, "framework.strategy": 2, "framework.plugins": 2,
    "framework.checkpoint": 3, "framework.data": 3, "framework.models": 3, "framework.tasks": 3,
    "framework.callbacks": 3, "framework.loggers": 3, "framework.scheduler": 3,
    "framework.reproduce": 3, "framework.sweeps": 3, "framework.plotting": 3,
    "framework.loop": 4,
    "framework.trainer": 5,
    "framework.launch": 6,
    "framework.runner": 7,
    "framework.entry_guard": 8,
    "framework.cli": 9, "framework.testing": 9, "framework.__main__": 9,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


TOP = max(FLOORS.values()) + 1  # the package root: `framework.run` and `framework.guard`


def floor(module: str) -> int:
    if module == "framework":
        return TOP
    matches = [name for name in FLOORS if module == name or module.startswith(name + ".")]
    assert matches, f"{module} has no floor in tests/test_layering.py FLOORS (and docs/architecture.md)"
    return FLOORS[max(matches, key=len)]


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def resolve(name: str) -> str:
    """The module an import of `name` loads (`framework.x.y` may name an attribute of `framework.x`)."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def framework_imports(path: Path):
    """(imported module, line, at top level) for every import of a framework module in `path`."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(node) for node in tree.body}
    # imports under `if TYPE_CHECKING:` at module level are not run: not dependencies
    skipped = {id(sub) for node in tree.body if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
               for sub in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            if name == "framework" or name.startswith("framework."):
                yield resolve(name), node.lineno, id(node) in top


def graph() -> dict[str, set[str]]:
    return {module: {target for target, _, _ in framework_imports(path) if target != module}
            for module, path in MODULES.items()}


def test_every_module_has_a_floor():
    for module in MODULES:
        floor(module)


def test_no_framework_import_inside_a_function():
    """Function-level imports hide cycles; they are for heavy optional packages only."""
    nested = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {target}"
              for m in MODULES for target, line, at_top in framework_imports(MODULES[m]) if not at_top]
    assert not nested, "\n".join(nested)


def test_no_upward_import():
    upward = [f"{m} (floor {floor(m)}) imports {t} (floor {floor(t)})"
              for m, targets in graph().items() for t in targets
              if floor(t) > floor(m)]
    assert not upward, "\n".join(upward)


def test_only_the_package_root_imports_the_package_root():
    """`import framework` runs framework/__init__.py, which sits above every floor."""
    offenders = sorted(m for m, targets in graph().items() if "framework" in targets)
    assert not offenders, f"import framework.version (or the module you need) instead of the root: {offenders}"


def test_no_import_cycle():
    edges = {m: {t for t in targets if t != "framework"} for m, targets in graph().items() if m != "framework"}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str):
        state[node] = 1
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                cycle = stack[stack.index(target):] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module)


def test_the_checker_sees_a_nested_import(tmp_path):
    """The checker itself: a nested import of a framework module is found, a top-level one is
    not flagged, and TYPE_CHECKING imports are not dependencies."""
    sample = tmp_path / "sample.py"
    sample.write_text("from typing import TYPE_CHECKING\nimport framework.errors\nif TYPE_CHECKING:\n"
                      "    from framework.runner import run\n\ndef f():\n    from framework.paths import conf_dir\n")
    found = sorted((t, top) for t, _, top in framework_imports(sample))
    assert found == [("framework.errors", True), ("framework.paths", False)]
