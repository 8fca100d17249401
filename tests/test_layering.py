"""The layering contract (docs/architecture.md, "Floors"): imports between the framework's own
modules run one way, ground floor first, sit at the top of the file, and form no cycle; a module
imports only from floors strictly below its own, or from its own package (no sideways import
between two packages of one floor); a function imports only the heavy optional packages listed in
docs/architecture.md.

Read from the source with `ast` (nothing is imported), so a violation in a branch that no test
runs is caught too. What counts as an import of a framework module: `import` and `from` statements
anywhere (relative ones resolved, `if TYPE_CHECKING:` blocks and their `else:` branches included),
`importlib.import_module("framework....")`, and any string that names a framework module (a
`_target_` the code builds, e.g. "framework.models.hf_causal_lm.from_pretrained").
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "framework"

# Floor of every module, by the longest matching name prefix. A module imports only from a lower
# floor or from its own package (framework.<package>). Keep in step with docs/architecture.md.
FLOORS = {
    "framework.errors": 0, "framework.version": 0, "framework.tensors": 0, "framework.signals": 0,
    "framework.sequences": 0,
    "framework.cgroup": 0,
    "framework.console": 1, "framework.paths": 1, "framework.batch_split": 1, "framework.sampling": 1,
    "framework.config": 2,
    "framework.registry": 3, "framework.sweep_record": 3, "framework.results": 3,
    "framework.accelerator": 4, "framework.precision": 4, "framework.checkpoint_io": 4, "framework.cluster": 4,
    "framework.fault_tolerance": 4,
    "framework.construction": 5,
    "framework.strategy": 6,
    "framework.plugins": 7, "framework.data": 7, "framework.scheduler": 7, "framework.reproduce": 7,
    "framework.checkpoint": 7, "framework.planning": 7, "framework.summary": 7,
    "framework.models": 8, "framework.adapter": 8,
    "framework.tasks": 9, "framework.loggers": 9, "framework.callbacks": 9, "framework.plotting": 9,
    "framework.sweeps": 10, "framework.generation": 10,
    "framework.loop": 11,
    "framework.trainer": 12,
    "framework.launch": 13, "framework.preflight": 13,
    "framework.exits": 14,
    "framework.modes": 15, "framework.sweep_job": 15,
    "framework.runner": 16,
    "framework.entry_guard": 17,
    "framework.cli": 18, "framework.testing": 18, "framework.reference": 18,
    "framework.__main__": 19,
}

# What a function may import (module name prefixes): heavy or optional packages, each imported
# only where it is used so that start-up stays short. Keep in step with docs/architecture.md.
HEAVY = (
    # optional extras (pyproject.toml): not installed everywhere
    "deepspeed", "pydantic", "fairscale", "tensorboard", "torch.utils.tensorboard", "mlflow", "transformers",
    "huggingface_hub", "datasets", "pyarrow", "tokenizers", "safetensors", "matplotlib", "bitsandbytes", "torch_xla",
    "transformer_engine", "peft", "wandb", "mpi4py", "torchmetrics", "zstandard", "torchft", "lm_eval",
    # parts of the core stack that cost a noticeable share of start-up, measured with torch loaded
    "torch.distributed.checkpoint",  # 0.42 s
    "torch.distributed.fsdp",  # 0.36 s
    "torch.distributed.tensor",  # 0.33 s
    "torch._dynamo",  # 0.71 s
    "torch.distributed.pipelining",  # 1.36 s after fsdp, tensor and checkpoint (it loads torch.export)
)

TOP = max(FLOORS.values()) + 1  # the package root: `framework.run` and `framework.guard`


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def floor(module: str) -> int:
    if module == "framework":
        return TOP
    matches = [name for name in FLOORS if module == name or module.startswith(name + ".")]
    assert matches, f"{module} has no floor in tests/test_layering.py FLOORS (and docs/architecture.md)"
    return FLOORS[max(matches, key=len)]


def package_of(module: str) -> str:
    """framework.<package>: the unit inside which imports may go any way the cycle rule allows."""
    return ".".join(module.split(".")[:2])


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}
MODULE_PATTERN = re.compile(r"framework(\.[A-Za-z_]\w*)+")


def resolve(name: str, modules=MODULES) -> str | None:
    """The module an import of `name` loads (`framework.x.y` may name an attribute of
    `framework.x`); None when no framework module matches."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in modules else None


@dataclass(frozen=True)
class Found:
    target: str  # the module imported (a framework module, or a third-party/stdlib name)
    line: int
    at_top: bool  # runs at import time (not inside a function)
    kind: str  # "import" (a statement) or "dynamic" (import_module or a target string)


def _relative_base(module: str, is_package: bool, level: int) -> str:
    parts = module.split(".") if is_package else module.split(".")[:-1]
    return ".".join(parts[: len(parts) - (level - 1)])


def _string_value(node: ast.AST) -> str | None:
    """A string literal, or the leading literal of an f-string (f"framework.cli.{name}")."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value).rstrip(".")
    return None


def _is_import_module(func: ast.AST) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id == "import_module")


def all_imports(path: Path, module: str | None = None) -> list[Found]:
    """Every import in `path`: statements (absolute and relative), and dynamic imports of
    framework modules (import_module calls and strings that name a framework module)."""
    module = module or module_name(path)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    found: list[Found] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function = True
        if isinstance(node, ast.Import):
            found.extend(Found(alias.name, node.lineno, not in_function, "import") for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(p for p in (_relative_base(module, is_package, node.level), base) if p)
            if base == "framework" or base.startswith("framework."):
                found.extend(Found(f"{base}.{alias.name}", node.lineno, not in_function, "import")
                             for alias in node.names)
            else:
                found.append(Found(base, node.lineno, not in_function, "import"))
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            text = _string_value(node.args[0])
            if text is not None and MODULE_PATTERN.fullmatch(text):
                found.append(Found(text, node.lineno, not in_function, "dynamic"))
            for child in [*node.args[1:], *node.keywords]:
                visit(child, in_function)
            return
        else:
            text = _string_value(node)
            # a target string names something inside a module ("framework.x.y.Class"); a string that
            # is exactly a module's name is a name (an entry point group), not an import
            if text is not None and MODULE_PATTERN.fullmatch(text) and resolve(text) not in (None, "framework", text):
                found.append(Found(text, node.lineno, not in_function, "dynamic"))
        for child in ast.iter_child_nodes(node):
            if not isinstance(node, ast.JoinedStr):  # its parts were read as one string above
                visit(child, in_function)

    visit(tree, False)
    return found


def framework_imports(path: Path, modules=MODULES, module: str | None = None):
    """(imported framework module, line, at top level, kind) for `path`."""
    for item in all_imports(path, module):
        if item.target == "framework" or item.target.startswith("framework."):
            target = resolve(item.target, modules) if item.target != "framework" else "framework"
            if target is not None:
                yield target, item.line, item.at_top, item.kind


def graph(runtime_only: bool = False) -> dict[str, set[str]]:
    """Module -> framework modules it imports (`runtime_only`: the statements that run at import
    time, what an import cycle is made of)."""
    return {module: {target for target, _, at_top, kind in framework_imports(path)
                     if target != module and (not runtime_only or (at_top and kind == "import"))}
            for module, path in MODULES.items()}


def layering_problems(module: str, targets) -> list[str]:
    """Upward and sideways imports of `module` (each target a framework module)."""
    problems = []
    for target in sorted(targets):
        if target == "framework" or package_of(target) == package_of(module):
            continue
        if floor(target) > floor(module):
            problems.append(f"{module} (floor {floor(module)}) imports {target} (floor {floor(target)}): upward")
        elif floor(target) == floor(module):
            problems.append(f"{module} imports {target}: sideways, both on floor {floor(module)}")
    return problems


def nested_import_problems(path: Path, module: str | None = None) -> list[str]:
    """Function-level imports that are not of a heavy optional package (HEAVY), and every
    function-level import of a framework module (they hide cycles)."""
    problems = []
    for item in all_imports(path, module):
        if item.at_top or item.kind != "import":
            continue
        if item.target == "framework" or item.target.startswith("framework."):
            problems.append(f"{path.name}:{item.line} imports {resolve(item.target) or item.target} inside a "
                            "function")
        elif not any(item.target == h or item.target.startswith(h + ".") for h in HEAVY):
            problems.append(f"{path.name}:{item.line} imports {item.target} inside a function; import it at the top "
                            "(or, if it is heavy or optional, add it to HEAVY and docs/architecture.md with its cost)")
    return problems


def test_every_module_has_a_floor():
    for module in MODULES:
        floor(module)


def test_no_import_inside_a_function_but_heavy_optional_packages():
    problems = [p for path in MODULES.values() for p in nested_import_problems(path)]
    assert not problems, "\n".join(problems)


def test_no_upward_or_sideways_import():
    problems = [p for m, targets in graph().items() for p in layering_problems(m, targets)]
    assert not problems, "\n".join(problems)


def test_only_the_package_root_imports_the_package_root():
    """`import framework` runs framework/__init__.py, which sits above every floor."""
    offenders = sorted(m for m, targets in graph().items() if "framework" in targets)
    assert not offenders, f"import framework.version (or the module you need) instead of the root: {offenders}"


def test_no_import_cycle():
    edges = {m: {t for t in targets if t != "framework"} for m, targets in graph(runtime_only=True).items()
             if m != "framework"}
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


def test_heavy_packages_are_the_documented_ones():
    docs = (ROOT / "docs" / "architecture.md").read_text()
    missing = [name for name in HEAVY if f"`{name}`" not in docs]
    assert not missing, f"docs/architecture.md does not list these function-level imports: {missing}"


# ---- the checker itself: each hole it once had, fed to it as a small file ------------------------
def _checked(tmp_path, module: str, source: str) -> list[str]:
    """What the checker says of `source` placed at framework/<...>.py as `module`."""
    path = tmp_path.joinpath(*module.split(".")).with_suffix(".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    targets = {t for t, _, _, _ in framework_imports(path, MODULES, module) if t != module}
    return layering_problems(module, targets) + nested_import_problems(path, module)


@pytest.mark.parametrize("source", [
    "from ..runner import run\n",  # relative, at the top
    "def f():\n    from ..runner import run\n",  # relative, in a function
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\nelse:\n    from framework.runner import run\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from framework.runner import Prepared\n",
    "import importlib\nrunner = importlib.import_module('framework.runner')\n",
    "TARGET = {'_target_': 'framework.runner.run'}\n",
], ids=["relative", "relative-in-function", "type-checking-else", "type-checking", "import_module", "target-string"])
def test_the_checker_sees_an_upward_import_however_written(tmp_path, source):
    problems = _checked(tmp_path, "framework.precision.sample", source)
    assert any("framework.runner" in p and "upward" in p for p in problems), problems


def test_the_checker_refuses_a_sideways_import(tmp_path):
    """Two packages of one floor: a precision may not import a cluster (nor a strategy, above it)."""
    assert any("sideways" in p for p in _checked(tmp_path, "framework.precision.sample",
                                                 "from framework.cluster.local import LocalEnvironment\n"))
    assert any("upward" in p for p in _checked(tmp_path, "framework.precision.sample",
                                               "from framework.strategy.base import Strategy\n"))
    assert _checked(tmp_path, "framework.precision.sample", "from framework.precision.base import Precision\n") == []


def test_the_checker_refuses_a_light_import_inside_a_function(tmp_path):
    source = "def f():\n    import json\n    import deepspeed\n    from torch.distributed.checkpoint import load\n"
    problems = _checked(tmp_path, "framework.precision.sample", source)
    assert len(problems) == 1 and "imports json inside a function" in problems[0], problems


def test_the_checker_refuses_a_framework_import_inside_a_function(tmp_path):
    problems = _checked(tmp_path, "framework.cli.sample", "def f():\n    from framework.paths import conf_dir\n")
    assert any("framework.paths inside a function" in p for p in problems), problems


def test_every_repository_path_the_code_names_exists():
    """A file named in a docstring, comment or message of the code (a module, a test, a YAML)
    exists: a stale reference sends the reader nowhere. Placeholders (conf/X/Y.yaml, <name>,
    globs) are not paths."""
    pattern = re.compile(r"(?<![\w./-])((?:framework|conf|tests|recipes|benchmarks|docs|examples|hydra_plugins)/"
                         r"[\w/.-]*\.(?:py|yaml|md|jsonl|json|sh))\b")
    stale = []
    for folder in ("framework", "conf", "tests", "benchmarks", "recipes", "examples", "hydra_plugins"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".yaml", ".md", ".sh") or "__pycache__" in path.parts \
                    or path.parent == ROOT / "tests" / "docs":  # the docs tests name missing files on purpose
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                for match in pattern.finditer(line):
                    named = match.group(1).rstrip(".")
                    if re.search(r"[<>{}*]|/[A-Z]+[/.]", named):
                        continue
                    if not (ROOT / named).exists() and not (ROOT / "tests" / named).exists():
                        stale.append(f"{path.relative_to(ROOT)}:{number}: {named}")
    assert not stale, "\n".join(stale)
