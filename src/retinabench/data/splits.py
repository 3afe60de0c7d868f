"""Patient-disjoint, label-stratified train/val/test splits per (dataset, task), with balanced variants.

Groups (patients) are assigned to ``n_folds`` folds by scikit-learn's ``StratifiedGroupKFold`` (seeded); the
first folds form train, the next val, the last test, in the configured proportions (70/15/15 -> 14/3/3 of 20).
``balanced`` marks the class-balanced variant of each split: every class undersampled to the rarest class's
count, seeded, for the paper's u-u / u-b / b-b / b-u regimes (first letter: training data, second: test data).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.model_selection import StratifiedGroupKFold

from retinabench.schemas import SPLIT, SPLITS


class SplitError(ValueError):
    pass


def task_rows(manifest: pd.DataFrame, task: dict) -> tuple[pd.DataFrame, int]:
    """Rows of ``manifest`` that belong to ``task`` (its modality, a known label) and the count without label.

    A task with ``derive`` (retinabench.data.derived) gets its label column mapped to its classes in the rows
    returned; the manifest itself is not changed."""
    label = task["label"]
    if label not in manifest.columns:
        raise SplitError(f"task {task['name']!r}: manifest of {task['dataset']!r} has no label column {label!r}")
    rows = manifest[manifest["modality"] == task["modality"]]
    unlabelled = int(rows[label].isna().sum())
    rows = rows[rows[label].notna()]
    if task.get("derive"):  # derived task (e.g. any DR from dr3): the label column holds the task's classes
        from retinabench.data.derived import apply_derive
        rows = apply_derive(rows, task)
    unknown = rows.loc[~rows[label].isin(task["classes"]), ["image_id", label]]
    if len(unknown):
        first = unknown.iloc[0]
        raise SplitError(f"task {task['name']!r}: image {first['image_id']} has label {first[label]!r} not in "
                         f"classes {task['classes']} ({len(unknown)} such rows)")
    return rows, unlabelled


def _fold_counts(fractions: dict[str, float], n_folds: int) -> dict[str, int]:
    if abs(sum(fractions.values()) - 1.0) > 1e-9:
        raise SplitError(f"split fractions must sum to 1, got {fractions}")
    counts = {k: fractions[k] * n_folds for k in SPLITS}
    if any(abs(v - round(v)) > 1e-9 or round(v) < 1 for v in counts.values()):
        raise SplitError(f"split fractions {fractions} are not whole, non-zero multiples of 1/{n_folds}")
    return {k: int(round(v)) for k, v in counts.items()}


def make_split(manifest: pd.DataFrame, task: dict, *, fractions: dict[str, float] | None = None, seed: int = 0,
               n_folds: int = 20) -> pd.DataFrame:
    fractions = fractions or {"train": 0.70, "val": 0.15, "test": 0.15}
    folds_per_split = _fold_counts(fractions, n_folds)
    rows, _ = task_rows(manifest, task)
    rows = rows.sort_values("image_id", kind="stable").reset_index(drop=True)
    classes = list(task["classes"])
    y = rows[task["label"]].map({c: i for i, c in enumerate(classes)}).to_numpy()
    n_groups = rows["patient_id"].nunique()
    if n_groups < n_folds:
        raise SplitError(f"task {task['name']!r}: {n_groups} patients, fewer than the {n_folds} folds needed")
    sgkf = StratifiedGroupKFold(n_splits=n_folds, shuffle=True, random_state=seed)
    fold = np.empty(len(rows), dtype=int)
    for k, (_, test_idx) in enumerate(sgkf.split(np.zeros(len(rows)), y, groups=rows["patient_id"].to_numpy())):
        fold[test_idx] = k
    # Fold indices are a random permutation of groups already (shuffle=True), so contiguous blocks are fine.
    edges = np.cumsum([folds_per_split[s] for s in SPLITS])
    split = np.array(SPLITS)[np.searchsorted(edges, fold, side="right")]
    out = pd.DataFrame({"image_id": rows["image_id"], "patient_id": rows["patient_id"].astype(str),
                        "dataset": task["dataset"], "task": task["name"], "label": rows[task["label"]].astype(str),
                        "y": y.astype("int64"), "split": split})
    out["balanced"] = _balanced_mask(out, seed)
    check_split(out, task)
    return out[SPLIT.names]


def _balanced_mask(df: pd.DataFrame, seed: int) -> np.ndarray:
    mask = np.zeros(len(df), dtype=bool)
    for i, name in enumerate(SPLITS):
        part = df.index[df["split"] == name]
        counts = df.loc[part, "y"].value_counts()
        if counts.empty:
            continue
        n_min = counts.min()
        rng = np.random.default_rng([seed, i])
        for cls in sorted(counts.index):
            idx = df.index[(df["split"] == name) & (df["y"] == cls)].to_numpy()
            mask[rng.choice(idx, size=n_min, replace=False)] = True
    return mask


def check_split(df: pd.DataFrame, task: dict) -> None:
    """Fail loudly on a patient in two splits, a missing class, or an unbalanced 'balanced' variant."""
    where = f"split of task {task['name']!r}"
    per_patient = df.groupby("patient_id")["split"].nunique()
    leaked = per_patient[per_patient > 1]
    if len(leaked):
        pid = leaked.index[0]
        seen = sorted(df.loc[df["patient_id"] == pid, "split"].unique())
        raise SplitError(f"{where}: patient {pid} appears in {seen} ({len(leaked)} patients in several splits)")
    if df["image_id"].duplicated().any():
        raise SplitError(f"{where}: duplicate image_id {df.loc[df['image_id'].duplicated(), 'image_id'].iloc[0]}")
    counts = df.groupby(["split", "y"]).size().unstack(fill_value=0).reindex(index=list(SPLITS), fill_value=0)
    counts = counts.reindex(columns=range(len(task["classes"])), fill_value=0)
    for s in SPLITS:
        for k, cls in enumerate(task["classes"]):
            if counts.loc[s, k] == 0:
                per = ", ".join(f"{t} {counts.loc[t, k]}" for t in SPLITS)
                raise SplitError(f"{where}: class {cls!r} has no images in {s} ({per}); "
                                 f"the task needs more patients of that class")
    bal = df[df["balanced"]].groupby(["split", "y"]).size().unstack(fill_value=0)
    for s in bal.index:
        if bal.loc[s].nunique() != 1:
            raise SplitError(f"{where}: balanced {s} subset has unequal class counts {bal.loc[s].to_dict()}")


def split_summary(df: pd.DataFrame, task: dict) -> dict:
    counts = df.groupby(["split", "label"]).size()
    return {
        "n_images": int(len(df)), "n_patients": int(df["patient_id"].nunique()),
        "counts": {f"{s}/{c}": int(n) for (s, c), n in counts.items()},
        "balanced_counts": {f"{s}/{c}": int(n) for (s, c), n in df[df["balanced"]].groupby(["split", "label"]).size().items()},
        "realised_fractions": {s: round(float((df["split"] == s).mean()), 4) for s in SPLITS},
    }


def regime_rows(split: pd.DataFrame, part: str, balanced: bool) -> pd.DataFrame:
    rows = split[split["split"] == part]
    return rows[rows["balanced"]] if balanced else rows

