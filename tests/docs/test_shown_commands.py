"""Every `framework ...` line of README.md, CONTRIBUTING.md and docs/ is a command the
`framework` command takes as written: its subcommand exists, and for the subcommands with their own
options (test, predict, generate, eval, convert, plot, lighthouse) the line parses with that
subcommand's own argument parser, its values checked as a user's would be (`--limit -1` fails).
A synopsis line (`[--limit N]`, `RUN_DIR|CHECKPOINT`) names only options the parser has. A line
that would fail as written fails here naming page and line. Lines with overrides are composed and
prepared by tests/test_docs.py; whole sections run as written there and in
tests/docs/test_walkthrough.py."""
from __future__ import annotations

import contextlib
import importlib
import io
import re
import shlex

import pytest

from framework.cli import PASS_THROUGH
from tests.conftest import ROOT

PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
OWN_PARSERS = {"test": "test", "predict": "predict", "generate": "generate", "eval": "eval", "convert": "convert",
               "plot": "plot", "lighthouse": "lighthouse"}


def is_synopsis(argv: list[str]) -> bool:
    """A line that describes a command rather than runs one: [--opt N], A|B, OVERRIDES..."""
    return any(token.startswith("[") or "|" in token or token.endswith("...") for token in argv)


def shown_framework_lines() -> list[tuple[str, str]]:
    """(page:line, the command after `framework`) for each line of a code block that runs `framework`."""
    found = []
    for page in PAGES:
        if not page.is_file():
            continue
        in_block = in_code = False
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                # a command block: bash, sh, console, or none named (```text blocks show output)
                in_block = not in_block
                in_code = in_block and line.strip().strip("`") in ("", "bash", "sh", "shell", "console")
                continue
            match = re.match(r"^\s*(?:\$ )?framework\s+(.*)$", line) if in_code else None
            if match:
                command = re.split(r"\s+#", match.group(1))[0].strip()
                found.append((f"{page.relative_to(ROOT)}:{number}", command))
    return found


LINES = shown_framework_lines()


def test_the_pages_show_framework_commands_of_every_kind():
    subcommands = {shlex.split(command)[0] for _, command in LINES}
    assert subcommands >= {"run", "plan", "test", "predict", "generate", "eval", "convert", "plot", "list", "cp"}


def _parse(subcommand: str, argv: list[str]) -> str | None:
    """What the subcommand's own parser says of `argv` (None: it parses)."""
    parser = importlib.import_module(f"framework.cli.{OWN_PARSERS[subcommand]}").parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if subcommand == "predict":
                parser.parse_intermixed_args(argv)
            else:
                parser.parse_args(argv)
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1]
    return None


def _options(subcommand: str) -> set[str]:
    parser = importlib.import_module(f"framework.cli.{OWN_PARSERS[subcommand]}").parser()
    return {option for action in parser._actions for option in action.option_strings}


@pytest.mark.parametrize("where,command", LINES, ids=[w for w, _ in LINES])
def test_a_shown_framework_line_is_one_the_command_takes(where, command):
    argv = shlex.split(command)
    subcommand, rest = argv[0], argv[1:]
    assert subcommand in {*PASS_THROUGH, "version", "--help", "-h"}, f"{where}: `framework {subcommand}` is no command"
    if subcommand not in OWN_PARSERS:
        _check_other(where, subcommand, rest)
        return
    if is_synopsis(rest):  # a synopsis: the options it names exist
        named = {token.strip("[]").split("=")[0] for token in rest if token.strip("[]").startswith("-")}
        unknown = named - _options(subcommand)
        assert not unknown, f"{where}: `framework {subcommand}` has no option {', '.join(sorted(unknown))}"
        return
    said = _parse(subcommand, rest)
    assert said is None, f"{where}: `framework {command}` fails as written: {said}"


def _check_other(where: str, subcommand: str, rest: list[str]) -> None:
    """The subcommands without a parser of their own, as far as a line can be checked without the
    files it names: `list` runs, `cp` names a built-in recipe and a destination, `version` takes
    nothing, the overrides of `train` and `prepare-data` compose (`run` and `plan`: tests/test_docs.py)."""
    from framework.paths import find_recipe
    from tests.conftest import compose_cfg
    from tests.helpers.in_process import run_command

    if subcommand == "list":
        result = run_command(["list", *rest], ROOT)
        assert result.returncode == 0, f"{where}: `framework list {' '.join(rest)}` fails: {result.stderr[-500:]}"
    elif subcommand == "cp":
        assert len(rest) == 2 and find_recipe(rest[0]).is_file(), f"{where}: `framework cp` takes RECIPE DEST"
    elif subcommand == "version":
        assert not rest, f"{where}: `framework version` takes no argument"
    elif subcommand in ("train", "prepare-data") and not is_synopsis(rest) and "-r" not in rest:
        compose_cfg(rest)  # a key or option that does not exist fails to compose


def test_a_failing_line_is_caught_naming_its_page(tmp_path, monkeypatch):
    """What a page would show wrong is found: the check on an added line fails naming it."""
    page = tmp_path / "page.md"
    page.write_text("```bash\nframework eval outputs/gpt --tasks x --limit -1\nframework evall outputs/gpt\n```\n")
    monkeypatch.setattr(f"{__name__}.PAGES", [page])
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    lines = shown_framework_lines()
    assert lines == [("page.md:2", "eval outputs/gpt --tasks x --limit -1"), ("page.md:3", "evall outputs/gpt")]
    for where, command in lines:
        with pytest.raises(AssertionError, match=rf"^{where}: `framework e"):
            test_a_shown_framework_line_is_one_the_command_takes(where, command)
