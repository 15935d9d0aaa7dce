"""The command line the scripts that generate docs pages share: write the page, or ``--check`` it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]


def main(page: Path, generate: Callable[[str], str], script: str, description: str,
         argv: list[str] | None = None) -> int:
    """Rewrite ``page`` as ``generate(its current text)``; with ``--check``, exit 1 when that would change it."""
    ap = argparse.ArgumentParser(description=description.splitlines()[0])
    ap.add_argument("--check", action="store_true", help=f"exit 1 if {page.relative_to(ROOT)} is stale")
    args = ap.parse_args(argv)
    have = page.read_text(encoding="utf-8") if page.exists() else ""
    want = generate(have)
    if want == have:
        return 0
    if args.check:
        print(f"{page.relative_to(ROOT)} is stale: run python {Path(script).relative_to(ROOT)}", file=sys.stderr)
        return 1
    page.write_text(want, encoding="utf-8")
    return 0
