"""Compare two results folders table by table: the behaviour-identical check of a refactoring.

    python bench/compare_results.py BEFORE AFTER [--parts metrics.parquet,analysis,reliability]

Compares every Parquet / CSV table under the given parts (default: ``metrics.parquet``, ``metrics.csv``,
``analysis/`` — the rank tables —, ``reliability/`` and ``predictions/``) cell for cell (exact, rows in file order),
and reports files present on one side only. Provenance sidecars (``*.prov.json``: timestamps, code hashes) and
figures are not compared. Exit status 0 when every table is identical, 1 otherwise (each difference listed).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

DEFAULT_PARTS = ("metrics.parquet", "metrics.csv", "analysis", "reliability", "predictions")
TABLE_SUFFIXES = (".parquet", ".csv")


def tables_under(root: Path, parts: tuple[str, ...]) -> dict[str, Path]:
    out = {}
    for part in parts:
        base = root / part
        files = [base] if base.is_file() else sorted(base.rglob("*")) if base.is_dir() else []
        for f in files:
            if f.is_file() and f.suffix in TABLE_SUFFIXES:
                out[str(f.relative_to(root))] = f
    return out


def read(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)


def difference(a: pd.DataFrame, b: pd.DataFrame) -> str | None:
    """None when identical, else a one-line description of the first difference."""
    if list(a.columns) != list(b.columns):
        return f"columns differ: {sorted(set(a.columns) ^ set(b.columns)) or 'order'}"
    if len(a) != len(b):
        return f"{len(a)} vs {len(b)} rows"
    try:
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_exact=True)
    except AssertionError as err:
        return " ".join(str(err).split())[:300]
    return None


def compare(before: Path, after: Path, parts: tuple[str, ...] = DEFAULT_PARTS) -> tuple[list[str], int]:
    a, b = tables_under(before, parts), tables_under(after, parts)
    problems = [f"only in {before}: {k}" for k in sorted(set(a) - set(b))]
    problems += [f"only in {after}: {k}" for k in sorted(set(b) - set(a))]
    for key in sorted(set(a) & set(b)):
        diff = difference(read(a[key]), read(b[key]))
        if diff:
            problems.append(f"{key}: {diff}")
    return problems, len(set(a) & set(b))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--parts", default=",".join(DEFAULT_PARTS))
    args = ap.parse_args()
    problems, n = compare(args.before, args.after, tuple(args.parts.split(",")))
    for p in problems:
        print(p)
    print(f"{n} tables compared, {len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
