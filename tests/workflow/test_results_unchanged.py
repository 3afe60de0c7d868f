"""Refactors leave results unchanged: the tiny run's metrics table and the data behind every figure and table (the
analysis, reliability and paper tables) equal the committed golden copy in tests/workflow/golden/.

A change that is meant to alter results regenerates the copy from a finished tiny run, and its commit says why:

    python tests/workflow/test_results_unchanged.py RUN_FOLDER   # RUN_FOLDER: a workflow copy run with tiny.yaml

Floats are compared to 1e-9 relative: the same code on the same libraries gives the same numbers, and a changed
default, seed or formula moves them by far more.
"""
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
# What the figures and tables are drawn from; per-job tables (predictions, reliability/jobs) are their inputs.
PARTS = ("metrics.parquet", "analysis", "tables", "reliability")
SUFFIXES = (".parquet", ".csv")


def golden_tables(results: Path) -> dict[str, Path]:
    out = {}
    for part in PARTS:
        base = results / part
        files = [base] if base.is_file() else sorted(base.glob("*")) if base.is_dir() else []  # not recursive
        out.update({str(f.relative_to(results)): f for f in files if f.is_file() and f.suffix in SUFFIXES})
    return out


def read(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)


@pytest.mark.slow
def test_the_tiny_runs_results_equal_the_golden_copy(tiny_workflow):
    now, golden = golden_tables(tiny_workflow / "results"), golden_tables(GOLDEN)
    assert set(now) == set(golden), f"tables added {sorted(set(now) - set(golden))}, gone {sorted(set(golden) - set(now))}"
    problems = []
    for name in sorted(golden):
        a, b = read(golden[name]), read(now[name])
        try:
            pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-9, atol=1e-12)
        except AssertionError as err:
            problems.append(f"{name}: {' '.join(str(err).split())[:400]}")
    assert not problems, "\n".join(problems)


def update(run: Path) -> None:
    shutil.rmtree(GOLDEN, ignore_errors=True)
    for name, path in golden_tables(run / "results").items():
        (GOLDEN / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, GOLDEN / name)
    print(f"{GOLDEN}: {len(golden_tables(GOLDEN))} tables from {run}")


if __name__ == "__main__":
    update(Path(sys.argv[1]))
