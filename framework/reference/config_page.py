"""docs/reference/config.md: every config group, option and key with the default a run uses, and
docs/_hooks/known_keys.json, the keys and options the docs' prose may name.

The facts come from where a run takes them: an option's keys and comments from its YAML, the keys
it leaves out (and every key's type) from its `_target_`'s signature (the arguments
framework/config/targets.py accepts), the trainer's and the root's keys from the schema
(framework/config/schema.py) with the values conf/ gives them.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from framework.config import schema
from framework.config.groups import LIST_GROUPS, PLUGIN_GROUPS
from framework.config.targets import HYDRA_KEYS, SUPPLIED_BY_RUNNER, import_target, parameters
from framework.config.yaml_comments import yaml_description, yaml_keys
from framework.errors import ConfigError

# Groups whose options are not `_target_` nodes of their own: a model family's fields (any field of
# transformers' config of that model_type is accepted), Hydra's launcher and sweeper settings.
OPEN_GROUPS = {"model/config": "model.config", "hydra/launcher": "hydra.launcher"}
GLOBAL_GROUPS = ("hparams_search",)  # `# @package _global_`: they set keys anywhere in the tree
ORDER = (*PLUGIN_GROUPS, "model", "model/config", "data", "task", "optimizer", "scheduler", "logger", "callbacks",
         "adapter", "trainer", "hparams_search", "hydra/launcher")


@dataclass
class Key:
    name: str  # the full dotted key, e.g. strategy.wrap_modules
    default: str  # as the YAML writes it, else the signature's default; "required" where there is none
    type: str = ""
    doc: str = ""


@dataclass
class OptionPage:
    group: str
    name: str
    path: Path
    description: str
    target: str = ""
    keys: list[Key] = field(default_factory=list)
    open_prefixes: list[str] = field(default_factory=list)  # any key below these is accepted


def type_name(hint) -> str:
    if hint is inspect.Parameter.empty or hint is None:
        return ""
    text = inspect.formatannotation(hint)
    text = re.sub(r"\btyping\.", "", text).replace("NoneType", "None")
    text = re.sub(r"Annotated\[([^,\[\]]+(?:\[[^\]]*\])?), [^\]]*\]", r"\1", text)
    optional = re.fullmatch(r"Optional\[(.*)\]", text)
    return f"{optional.group(1)} | None" if optional else text


def as_yaml(value) -> str:
    """A Python default as YAML writes it: null, true/false, the rest as printed."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _default(param: inspect.Parameter) -> str:
    if param.default is inspect.Parameter.empty:
        return "required"
    return repr(param.default) if isinstance(param.default, str) else as_yaml(param.default)


def _is_mapping(hint) -> bool:
    hint_text = type_name(hint)
    return hint is typing.Any or any(word in hint_text for word in ("dict", "Dict", "Mapping", "Any"))


def _target_keys(page: OptionPage, prefix: str, target_path: str, written: dict) -> None:
    """The keys of one `_target_` node: those the YAML writes, then the signature's others."""
    try:
        target = import_target(target_path, prefix)
    except ConfigError:  # an optional package's class (Hydra's launcher): the YAML's keys alone
        target = None
    found = parameters(target) if target is not None else None
    params, hints, takes_kwargs = found if found else ({}, {}, True)
    page.target = page.target or target_path
    supplied = set().union(*(names for pattern, names in SUPPLIED_BY_RUNNER.items()
                             if re.fullmatch(pattern.replace(".", r"\.").replace("*", ".*"), prefix)))
    for name, entry in written.items():
        hint = hints.get(name, params[name].annotation if name in params else inspect.Parameter.empty)
        page.keys.append(Key(f"{prefix}.{name}", entry.value or "(a mapping)", type_name(hint), entry.comment))
        if (name in params or takes_kwargs) and (not entry.value or _is_mapping(hint)):
            page.open_prefixes.append(f"{prefix}.{name}.")
    for name, param in params.items():
        if name in written or name in supplied or param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
            continue
        hint = hints.get(name, param.annotation)
        page.keys.append(Key(f"{prefix}.{name}", _default(param), type_name(hint),
                             f"an argument of {target_path.rsplit('.', 1)[-1]} the YAML leaves at its default"))
        if _is_mapping(hint):
            page.open_prefixes.append(f"{prefix}.{name}.")
    if takes_kwargs:
        page.open_prefixes.append(f"{prefix}.")


def option_page(group: str, path: Path) -> OptionPage:
    page = OptionPage(group, path.stem, path, yaml_description(path))
    entries = yaml_keys(path)
    by_path = {e.path: e for e in entries}
    if group in OPEN_GROUPS or group in GLOBAL_GROUPS:
        prefix = OPEN_GROUPS.get(group, "")
        for entry in entries:
            if entry.path != "defaults" and not entry.path.startswith("defaults."):
                page.keys.append(Key(f"{prefix}.{entry.path}".lstrip("."), entry.value or "(a mapping)", "",
                                     entry.comment))
        page.target = str(OmegaConf.load(path).get("_target_", "") or "")
        if prefix:
            page.open_prefixes.append(prefix + ".")
        return page
    if group in LIST_GROUPS:  # each option is keyed by its own name: callbacks.checkpoint.monitor
        prefix, node_path = f"{group}.{path.stem}", path.stem
    else:
        prefix, node_path = group.replace("/", "."), ""
    target_path = by_path.get(f"{node_path}._target_" if node_path else "_target_")
    below = f"{node_path}." if node_path else ""
    written = {e.path[len(below):]: e for e in entries if e.path.startswith(below) and "." not in e.path[len(below):]
               and e.path[len(below):] not in HYDRA_KEYS and e.path[len(below):] != "defaults"}
    reserved = {"interval"} if group == "scheduler" else set()
    for name in reserved & written.keys():
        entry = written.pop(name)
        page.keys.append(Key(f"{prefix}.{name}", entry.value, "str", entry.comment))
    if target_path is None:
        for name, entry in written.items():
            page.keys.append(Key(f"{prefix}.{name}", entry.value or "(a mapping)", "", entry.comment))
        return page
    _target_keys(page, prefix, target_path.value, written)
    return page


def _field_docs(cls) -> dict[str, str]:
    """The docstring under each field of a dataclass, read from its source."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


def schema_keys(cls, prefix: str, values: dict, skip: tuple[str, ...] = ()) -> list[Key]:
    docs = _field_docs(cls)
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if f.name in values:
            value = values[f.name]
        elif f.default is not dataclasses.MISSING:
            value = f.default
        else:
            value = f.default_factory() if f.default_factory is not dataclasses.MISSING else "required"
        keys.append(Key(f"{prefix}{f.name}", as_yaml(value), type_name(hints[f.name]), docs.get(f.name, "")))
    return keys


def group_options(conf: Path) -> dict[str, list[Path]]:
    groups: dict[str, list[Path]] = {}
    for path in sorted(conf.rglob("*.yaml")):
        group = path.parent.relative_to(conf).as_posix()
        if group != ".":
            groups.setdefault(group, []).append(path)
    return dict(sorted(groups.items(), key=lambda kv: (ORDER.index(kv[0]) if kv[0] in ORDER else len(ORDER), kv[0])))


def _raw_yaml(path: Path) -> dict:
    return {e.path: e.value for e in yaml_keys(path) if "." not in e.path}


def root_keys(conf: Path) -> list[Key]:
    groups = set(group_options(conf)) | {"hydra", "logger", "callbacks", "scheduler", "adapter", "trainer"}
    return schema_keys(schema.TrainConfig, "", _raw_yaml(conf / "train.yaml"), skip=tuple(groups))


def trainer_keys(conf: Path) -> list[Key]:
    return schema_keys(schema.TrainerConfig, "trainer.", _raw_yaml(conf / "trainer" / "default.yaml"))


def pages(conf: Path) -> list[OptionPage]:
    return [option_page(group, path) for group, paths in group_options(conf).items() if group != "trainer"
            for path in paths]


# ---- the page -----------------------------------------------------------------------------------

def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return f"`{text}`" if text and text != "required" and "`" not in text else text


def _table(keys: list[Key]) -> list[str]:
    lines = ["| key | default | type | what it does |", "|---|---|---|---|"]
    lines += [f"| `{k.name}` | {_cell(_code(k.default))} | {_cell(_code(k.type))} | {_cell(k.doc)} |" for k in keys]
    return lines


def anchor(group: str, option: str | None = None) -> str:
    text = group.replace("/", "-") + (f"-{option}" if option else "")
    return re.sub(r"[^a-z0-9_-]", "", text.lower())


def render(conf: Path, root: Path) -> str:
    out = [
        "# Config reference",
        "",
        "<!-- Generated by `make reference` (framework/reference/config_page.py) from conf/ and the code;",
        "     edit those, not this page. tests/docs/test_reference.py fails when it is stale. -->",
        "",
        "Every key a run reads, by group and option: the default is the one a run uses when the key is",
        "not given (the option's YAML where it sets one, else the target's signature), the type is the",
        "one the target's signature declares (checked before launch, framework/config/targets.py), and",
        "the text is the comment above the key in the YAML (or the schema's field docstring). Set any",
        "key on the command line (`python train.py strategy=fsdp strategy.reshard_after_forward=false`)",
        "or in a recipe. `framework list` says which options run on this machine;",
        "[Options of the plugin groups](../options.md) what each is for.",
        "",
        "## The root",
        "",
        "Top-level keys (framework/config/schema.py `TrainConfig`; their values in conf/train.yaml).",
        "",
        *_table(root_keys(conf)),
        "",
        "## trainer",
        "",
        "The loop's settings (framework/config/schema.py `TrainerConfig`, the values of conf/trainer/default.yaml).",
        "",
        *_table(trainer_keys(conf)),
        "",
    ]
    current = None
    all_pages = pages(conf)
    for page in all_pages:
        if page.group != current:
            current = page.group
            out += [f"## {current}", ""]
            if current in LIST_GROUPS:
                names = [p.name for p in all_pages if p.group == current][:2]
                out += [f"Chosen as a list (`{current}=[{','.join(names)}]`); each option's keys sit under its name.",
                        ""]
            if current in OPEN_GROUPS:
                out += [f"Any field of the family's configuration is accepted under `{OPEN_GROUPS[current]}`; "
                        "the YAML's fields are these.", ""]
        source = page.path.relative_to(root).as_posix()
        out += [f"### `{page.group}={page.name}`", "", f"{page.description}" if page.description else "", ""]
        out += [f"File: {source}" + (f"; target: `{page.target}`" if page.target else "") + ".", ""]
        if page.keys:
            out += [*_table(page.keys), ""]
        else:
            out += ["No keys.", ""]
    return "\n".join(line for i, line in enumerate(out) if line or (i and out[i - 1])) + "\n"


def known_keys(conf: Path, extra_conf: list[Path]) -> dict:
    """What the docs' prose may name: every option of every group (conf/ and the example plugin's),
    every key, and the prefixes below which any key is accepted."""
    conf_options = {g: [p.stem for p in paths] for g, paths in group_options(conf).items()}
    options: dict[str, list[str]] = {}
    for tree in (conf, *extra_conf):
        for group, paths in group_options(tree).items():
            options.setdefault(group, [])
            options[group] += [p.stem for p in paths if p.stem not in options[group]]
    roots = root_keys(conf)
    keys = {k.name for k in roots} | {k.name for k in trainer_keys(conf)}
    open_prefixes = {"hydra."} | {f"{k.name}." for k in roots if k.type == "Any"}  # trust.allow=[...]
    for page in [*pages(conf), *(p for tree in extra_conf for p in pages(tree))]:
        keys |= {k.name for k in page.keys}
        # `auto` passes its keywords on to the option it picks: the keys that option takes count
        own = page.group.replace("/", ".") + "."
        open_prefixes |= {p for p in page.open_prefixes if not (page.name == "auto" and p == own)}
        if page.group in LIST_GROUPS:
            keys.add(f"{page.group}.{page.name}")
    for name in list(keys):  # the mappings on the way to a key are keys too
        parts = name.split(".")
        keys |= {".".join(parts[:i]) for i in range(1, len(parts))}
    return {"plugin_groups": list(PLUGIN_GROUPS),
            "options": {g: sorted(o) for g, o in sorted(options.items())}, "conf_options": conf_options,
            "keys": sorted(keys),
            "open": sorted(open_prefixes)}
