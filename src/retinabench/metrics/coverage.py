"""Coverage: for every (model, dataset, task), how many rows each analysis evaluated, excluded or skipped, and why.

One tidy row per (source, encoder, protocol, dataset, task, regime, scope, status, reason) with ``n_rows``.
``scope`` names the analysis (``test``, ``labels``, ``images``, ``split``, ``threshold``, ``calibration``,
``attribute:<name>``, ``harmonised``, ``transfer``); ``status`` is one of ``evaluated``, ``excluded`` (rows left
out, e.g. an unknown sex), ``not_evaluated`` (rows used for something else, e.g. training), ``skipped`` (an
analysis that could not run, e.g. a group below the minimum size) and ``not_supported`` (a harmonised task a
dataset has no valid labels for).
"""
from __future__ import annotations

import pandas as pd

COVERAGE_COLUMNS = ["source", "encoder", "protocol", "dataset", "task", "regime", "scope", "status", "n_rows",
                    "reason"]
STATUSES = ("evaluated", "excluded", "not_evaluated", "skipped", "not_supported")


class Coverage:
    """Collects coverage rows for one model cell (the fixed keys) and turns them into a frame."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, keys: dict, scope: str, status: str, n_rows: int | None, reason: str = "") -> None:
        if status not in STATUSES:
            raise ValueError(f"coverage status {status!r} not in {STATUSES}")
        missing = [k for k in COVERAGE_COLUMNS[:6] if k not in keys]
        if missing:
            raise KeyError(f"coverage row lacks keys {missing}")
        self.rows.append({**{k: keys[k] for k in COVERAGE_COLUMNS[:6]}, "scope": scope, "status": status,
                          "n_rows": None if n_rows is None else int(n_rows), "reason": reason})

    def frame(self) -> pd.DataFrame:
        df = pd.DataFrame(self.rows, columns=COVERAGE_COLUMNS)
        df["n_rows"] = df["n_rows"].astype("Int64")
        # Seeds of one protocol share rows and reasons: one row per distinct record.
        return df.drop_duplicates(ignore_index=True)


def label_exclusions(exclusions: pd.DataFrame, manifest: pd.DataFrame, task: dict) -> list[tuple[str, str, int]]:
    """(scope, reason, n) of the adapter's exclusions that concern ``task``: images of the task's modality
    without its label (scope ``label:<label column>``), and the dataset's dropped images (scope ``image``; the
    adapter does not know their modality, so they are reported for every task of the dataset)."""
    missing = [c for c in ("image_id", "scope", "reason") if c not in exclusions.columns]
    if missing:
        raise KeyError(f"exclusions table lacks columns {missing}")
    of_modality = set(manifest.loc[manifest["modality"] == task["modality"], "image_id"])
    out = []
    lab = exclusions[(exclusions["scope"] == f"label:{task['label']}") & exclusions["image_id"].isin(of_modality)]
    for reason, n in lab.groupby("reason").size().sort_index().items():
        out.append(("labels", f"{task['label']}: {reason}", int(n)))
    img = exclusions[exclusions["scope"] == "image"]
    for reason, n in img.groupby("reason").size().sort_index().items():
        out.append(("images", f"dataset-level: {reason}", int(n)))
    return out
