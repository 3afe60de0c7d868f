"""``python -m retinabench.settings schema|docs [--check] [--output PATH]``: write (or, with --check, compare)
workflow/schemas/config.schema.yaml or docs/configuration.md generated from the models."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from retinabench.settings.generate import DOCS_PATH, SCHEMA_PATH, docs_text, schema_text

TARGETS = {"schema": (SCHEMA_PATH, schema_text), "docs": (DOCS_PATH, docs_text)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m retinabench.settings", description=__doc__)
    parser.add_argument("what", choices=sorted(TARGETS))
    parser.add_argument("--output", help="file to write (default: %(default)s relative to the repository root)")
    parser.add_argument("--check", action="store_true", help="exit 1 when the file differs, write nothing")
    args = parser.parse_args(argv)
    default, make = TARGETS[args.what]
    path = Path(args.output or default)
    text = make()
    if args.check:
        same = path.is_file() and path.read_text() == text
        verdict = "up to date" if same else f"differs from the models (python -m retinabench.settings {args.what})"
        print(f"{path}: {verdict}", file=sys.stderr)
        return 0 if same else 1
    from retinabench.atomic import write_text_atomic
    write_text_atomic(path, text)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
