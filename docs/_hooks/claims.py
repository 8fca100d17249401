"""mkdocs hook: the prose of README.md and docs/ names only config keys, options and repository
paths that exist.

Checked in every page (README.md as the home page), outside fenced code blocks (their commands are
composed and validated by tests/test_docs.py):
- every `group=option` (also `group=[a,b]`, a sweep's `group=a,b`, `+`/`~` prefixes) names an
  option of conf/ (or of the example plugin, examples/plugin);
- every `group.key` or `group.key=value` in backticks names a key a run reads
  (docs/_hooks/known_keys.json, generated from conf/ and the code by `make reference`);
- every path under the repository's own folders (framework/, conf/, tests/, ...) exists;
- no count of the plugin groups is written by hand, and a list of them that names the strategy
  names them all;
- the options page names every option of conf/.
A line that shows a mistake on purpose (the errors page's `strategy=ddpp`) carries the comment
`<!-- wrong on purpose -->`. Each finding is a warning naming the page and the line, which fails
`mkdocs build --strict` (`make docs`). Needs nothing but the standard library: the docs build
without torch.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import logging
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KNOWN = Path(__file__).with_name("known_keys.json")
FOLDERS = ("framework", "conf", "tests", "recipes", "benchmarks", "docs", "examples", "hydra_plugins", ".ci")
ON_PURPOSE = "<!-- wrong on purpose -->"
FILE_SUFFIX = re.compile(r"\.(pt|pth|bin|json|jsonl|yaml|yml|py|md|csv|png|txt|safetensors|gz|zst|log|pickle|html|sh|toml)$")
NUMBERS = r"(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|\d+)"
PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z0-9_]*|<[^>]*>|\.\.\.|\*\*)$")
log = logging.getLogger("mkdocs.hooks.claims")
_spec = importlib.util.spec_from_file_location("framework_docs_home", Path(__file__).with_name("home.py"))
_home = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_home)  # which repository file a page's text is read from


def load_known(path: Path = KNOWN) -> dict:
    known = json.loads(path.read_text())
    known["keys"] = set(known["keys"])
    return known


def _roots(known: dict) -> set[str]:
    return {k.split(".")[0] for k in known["keys"]} | {g.split("/")[0] for g in known["options"]}


def _key_exists(key: str, known: dict) -> bool:
    if key.rsplit(".", 1)[-1] in ("_target_", "_partial_"):  # every plugin node has them
        return True
    return key in known["keys"] or any(key.startswith(p) for p in known["open"])


def _placeholder(value: str) -> bool:
    """A name the reader fills in: NAME, <dir>, ..., or the reader's own (my_strategy, mypkg)."""
    if value.startswith(("my_", "mypkg", "my-")):
        return True
    return any(PLACEHOLDER.match(part) for part in re.split(r"[/.,\[\]]", value) if part) or "<" in value \
        or "..." in value or "$" in value or "{" in value


def check_token(token: str, known: dict) -> str | None:
    """A problem with one whitespace-separated word of an inline code span, or None."""
    token = token.strip(",;:()").lstrip("+~")
    name, eq, value = token.partition("=")
    if not name or name.startswith("-") or ("/" in name and not eq):  # a flag, or a path (checked as one)
        return None
    if eq and name in known["options"]:  # group=option (model/config=llama too)
        group = name
        value = value.strip("'\"")
        if not value or _placeholder(value) or value in ("null", "none"):
            return None
        choices = [v for v in re.split(r"[\[\],]", value) if v and v not in ("null", "none")]
        missing = [v for v in choices if v not in known["options"][group] and not _placeholder(v)]
        if missing:
            return f"`{token}`: {group} has no option {', '.join(repr(m) for m in missing)} (options: " \
                   f"{', '.join(known['options'][group])})"
        return None
    if "." not in name or name.split(".")[0] not in _roots(known) or name.startswith("hydra."):
        return None
    if FILE_SUFFIX.search(name) or _placeholder(name) or not re.fullmatch(r"[A-Za-z_][\w.]*", name):
        return None
    if not _key_exists(name, known):
        close = sorted(k for k in known["keys"] if k.split(".")[0] == name.split(".")[0]
                       and k.rsplit(".", 1)[-1][:4] == name.rsplit(".", 1)[-1][:4])
        return f"`{name}` is not a config key{f' (did you mean {close[0]}?)' if close else ''}"
    return None


_PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(re.escape(f) for f in FOLDERS)})/[\w./*<>{{}}-]*)")


def check_path(text: str) -> str | None:
    path = re.sub(r"(::\w.*|:\d+.*|#.*)$", "", text).rstrip(".,;:)")
    if not path or _placeholder(path) or any(PLACEHOLDER.match(p) for p in path.split("/")):
        return None
    if "*" in path:
        return None if glob.glob(str(ROOT / path), recursive=True) else f"{path}: no file matches"
    return None if (ROOT / path).exists() else f"{path}: no such file or folder in the repository"


def _group_lists(line: str, groups: list[str]) -> list[str]:
    """A written list of plugin groups ('accelerator, strategy, precision, ...') that names the
    strategy among four or more names them all (a list without the strategy is another thing: the
    plugins a strategy is composed of)."""
    name = "(?:" + "|".join(groups) + ")"
    problems = []
    for match in re.finditer(rf"`?{name}`?(?:(?:,| and| or|, and|, or) `?{name}`?)+", line):
        named = re.findall(name, match.group(0))
        if "strategy" in named and len(named) >= 4 and set(named) != set(groups):
            left_out = ", ".join(g for g in groups if g not in named)
            problems.append(f"lists the plugin groups without {left_out} (framework/config/groups.py PLUGIN_GROUPS)")
    return problems


def check_page(text: str, known: dict) -> list[tuple[int, str]]:
    """(line number, problem) for every claim of the page that does not hold."""
    problems = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if ON_PURPOSE in line:
            continue
        for match in _PATH.finditer(line):
            problem = check_path(match.group(1))
            if problem:
                problems.append((number, problem))
        if fenced:
            continue
        for span in re.findall(r"`([^`]+)`", line):
            for token in span.split():
                problem = check_token(token, known)
                if problem:
                    problems.append((number, problem))
        problems += [(number, p) for p in _group_lists(line, known["plugin_groups"])]
        for match in re.finditer(rf"\b{NUMBERS} plugin groups?\b", line, re.I):
            problems.append((number, f"'{match.group(0)}': the number of plugin groups is not written by hand "
                                     "(framework/config/groups.py PLUGIN_GROUPS holds it); say 'the plugin groups'"))
    return problems


def check_options_page(text: str, known: dict) -> list[tuple[int, str]]:
    """The options page names every option of conf/ (not the example plugin's)."""
    missing = [f"{group}={option}" for group, options in known["conf_options"].items() for option in options
               if f"`{option}`" not in text and f"{group}={option}" not in text]
    return [(1, f"the options page does not name {m}") for m in missing]


def page_problems(name: str, text: str, known: dict) -> list[str]:
    problems = check_page(text, known)
    if name == "docs/options.md":
        problems += check_options_page(text, known)
    return [f"{name}:{line}: {problem}" for line, problem in problems]


def on_page_markdown(markdown, page, config, files):
    name = _home.source_of(page.file.src_uri)
    text = (ROOT / name).read_text()
    for problem in page_problems(name, text, load_known()):
        log.warning(problem)
    return markdown
