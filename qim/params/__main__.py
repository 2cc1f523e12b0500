"""``python -m qim.params``: write ``docs/parameters.md``; ``--check`` fails if it is stale."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from qim.params.render import render_markdown

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "docs" / "parameters.md"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(prog="python -m qim.params", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    parser.add_argument("--output", type=Path, default=DEFAULT_PATH, help="file to write")
    args = parser.parse_args(argv)
    rendered = render_markdown()
    path: Path = args.output
    if args.check:
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != rendered:
            print(f"{path} is stale; run python -m qim.params", file=sys.stderr)
            return 1
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(rendered, encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
