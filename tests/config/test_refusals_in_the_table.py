"""Every refusal of a combination of settings is a row of the one table (framework/config/compatibility.py),
read before launch. A ConfigError raised anywhere else whose message names the keys of two or more
config groups (strategy= with data.packing, precision= with strategy=...) is a combination refused
outside the table, unless it is a `problems()` method (what a plugin finds wrong with the model
itself, also read before launch) or one of the run-time backstops below, each of which can only be
seen when it happens."""
from __future__ import annotations

import ast
import re

from tests.conftest import ROOT

GROUPS = re.compile(r"\b(accelerator|strategy|precision|checkpoint_io|cluster|task|data|model|trainer|adapter|"
                    r"optimizer|fault_tolerance)[.=]")

#: (file, function): why it can only be refused when it happens
BACKSTOPS = {
    ("framework/batch_split.py", "refuse_positions_in_stages"):
        "a batch that carries position_ids though its data did not say it packs (the table's row covers those that do)",
    ("framework/strategy/mesh/context.py", "forward"):
        "a model's attention seen computing without scaled_dot_product_attention, only known when it runs",
    ("framework/adapter/lora.py", "adapters_off"):
        "the adapted model has no adapter layer to turn off (the model's own modules)",
    ("framework/adapter/lora.py", "targets"): "adapter.target_modules matched against the model's own layers",
    ("framework/adapter/lora.py", "apply"): "adapter.modules_to_save matched against the model's own modules",
}


def _own_nodes(function: ast.AST):
    """The nodes of `function`'s body, not those of the functions defined inside it (theirs)."""
    nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
    stack = [node for node in function.body if not isinstance(node, nested)]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(child for child in ast.iter_child_nodes(node) if not isinstance(child, nested))


def combination_refusals(source: str, path: str) -> list[tuple[str, str, int]]:
    """(file, function, line) of every `raise ConfigError(...)` in `source` naming two config groups'
    keys, outside a problems() method."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) or function.name == "problems":
            continue
        for node in _own_nodes(function):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) \
                    and getattr(node.exc.func, "id", None) == "ConfigError":
                text = "".join(n.value for n in ast.walk(node.exc) if isinstance(n, ast.Constant) and isinstance(n.value, str))
                if len(set(GROUPS.findall(text))) >= 2:
                    found.append((path, function.name, node.lineno))
    return found


def _outside_the_table() -> list[tuple[str, str, int]]:
    found = []
    for path in sorted((ROOT / "framework").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if name != "framework/config/compatibility.py":
            found += combination_refusals(path.read_text(), name)
    return found


def test_every_refusal_of_a_combination_is_in_the_table_or_a_named_backstop():
    stray = [f for f in _outside_the_table() if (f[0], f[1]) not in BACKSTOPS]
    assert not stray, f"refusals of a combination outside framework/config/compatibility.py: {stray}"


def test_every_backstop_named_still_refuses_there():
    assert {(f[0], f[1]) for f in _outside_the_table()} >= set(BACKSTOPS)


def test_a_refusal_moved_out_of_the_table_is_found():
    moved = '''
def setup(self):
    if self.precision == "16-mixed" and self.strategy_name == "pipeline":
        raise ConfigError(f"precision=16-mixed with strategy={self.strategy_name}: use precision=bf16.")
'''
    assert combination_refusals(moved, "moved.py") == [("moved.py", "setup", 4)]
    one_group = 'def f():\n    raise ConfigError("model.n_head=3 must divide model.n_embd=32.")\n'
    assert combination_refusals(one_group, "one_group.py") == []
