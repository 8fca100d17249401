"""mkdocs hook: pages of the site whose text lives at the repository's top, so that one text serves
both: the home page is README.md, contributing.md is CONTRIBUTING.md, changelog.md is CHANGELOG.md
(each docs/ file holds only a comment saying so). Their links into docs/ are made relative to the
site; a link to another file of the repository (LICENSE, benchmarks/README.md), which the site
does not carry, becomes its plain text."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FROM_ROOT = {"index.md": "README.md", "contributing.md": "CONTRIBUTING.md", "changelog.md": "CHANGELOG.md"}


def source_of(src_uri: str) -> str:
    """The repository file a page's text is read from: README.md for index.md, docs/X otherwise."""
    return FROM_ROOT.get(src_uri, f"docs/{src_uri}")


def for_the_site(text: str) -> str:
    pages = {root: page for page, root in FROM_ROOT.items()}

    def link(match: re.Match) -> str:
        label, target = match.group(1), match.group(2)
        if re.match(r"https?:|#|mailto:", target):
            return match.group(0)
        path, _, anchor = target.partition("#")
        path = pages.get(path, path.removeprefix("docs/"))
        if (ROOT / "docs" / path).is_file():
            return f"[{label}]({path}{'#' + anchor if anchor else ''})"
        return label  # a file of the repository the site does not carry: its text alone

    return re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)", link, text).replace("](docs/", "](")


def on_page_read_source(page, config):
    if page.file.src_uri not in FROM_ROOT:
        return None
    return for_the_site((ROOT / FROM_ROOT[page.file.src_uri]).read_text())
