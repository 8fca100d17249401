"""The front page: short, with what a newcomer looks for (install, status, a picture, results),
its results table made by benchmarks/front_page.py from the committed measurements, and the files
a project is expected to carry."""
from __future__ import annotations

import re
import runpy
from importlib.metadata import metadata

from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()
front_page = runpy.run_path(str(ROOT / "benchmarks" / "front_page.py"))


def test_the_readme_is_short_and_has_what_a_newcomer_looks_for():
    assert len(README.splitlines()) <= 250
    for heading in ("## Install", "## The two commands", "## Results", "## Ten commands that show the range",
                    "## Licence"):
        assert f"\n{heading}\n" in README, heading
    assert "**Status.**" in README and "![" in README
    picture = re.search(r"!\[[^\]]*\]\(([^)]+)\)", README).group(1)
    assert (ROOT / picture).is_file() and (ROOT / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not re.search(r"\d+(\.\d+)? minutes", README), "suite timings belong in CONTRIBUTING.md"


def test_the_results_table_is_what_the_script_makes_of_the_committed_results():
    block = README.split(front_page["START"], 1)[1].split(front_page["END"], 1)[0]
    stamp = re.search(r"made by benchmarks/front_page.py \(([^)]*)\)", block).group(1)
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}, commit \w+", stamp)
    assert front_page["START"] + block + front_page["END"] == front_page["block"](stamp), \
        "stale: run `python benchmarks/front_page.py` and commit README.md"
    for figure in ("Lightning", "fsdp", "vs raw compiled", "validation loss 5.52"):
        assert figure in block, figure


def test_the_readme_names_every_extra_and_what_it_brings():
    extras = set(metadata("framework").get_all("Provides-Extra")) - {"xla-test", "floor-test"}
    table = README.split("| extra | brings | for |", 1)[1].split("\n\n", 1)[0]
    named = {name for row in table.splitlines()[2:] for name in re.findall(r"`([\w-]+)`", row.split("|")[1])}
    assert named == extras


def test_a_project_carries_its_licence_changelog_contributing_guide_and_citation():
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert "Version 2.0, January 2004" in (ROOT / "LICENSE").read_text()
    assert metadata("framework")["License-Expression"] == "Apache-2.0"
    citation = (ROOT / "CITATION.cff").read_text()
    assert "cff-version: 1.2.0" in citation and "license: Apache-2.0" in citation
    assert (ROOT / "CHANGELOG.md").read_text().startswith("# Changelog")
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    for topic in ("## Set-up", "make reference", "## Adding a plugin", "## Tests", "tests/test_layering.py"):
        assert topic in contributing, topic
