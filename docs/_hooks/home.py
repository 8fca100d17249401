"""mkdocs hook: the site's home page is the repository's README.md (one text for both), its links
into docs/ made relative to the site."""
from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def on_page_read_source(page, config):
    if page.file.src_uri != "index.md":
        return None
    return README.read_text().replace("](docs/", "](")
