"""`python -m framework.reference [--check]` (`make reference`): write the generated pages of the
manual, or with --check say which are stale (exit 1) without writing."""
from __future__ import annotations

import argparse
import sys

from framework.reference.pages import ROOT, generated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m framework.reference", description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare with the committed pages; write nothing")
    args = parser.parse_args(argv)
    stale = []
    for path, text in generated().items():
        if path.is_file() and path.read_text() == text:
            continue
        stale.append(path.relative_to(ROOT).as_posix())
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if args.check and stale:
        print(f"stale generated pages: {', '.join(stale)}; run `make reference` and commit them", file=sys.stderr)
        return 1
    print(("wrote " if stale else "up to date: ") + (", ".join(stale) or "every generated page"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
