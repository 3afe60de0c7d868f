"""Split groups and the checks every split method shares (retinabench.data.splits, the module doc).

**Groups.** Images are grouped by the connected components of "same patient id" ∪ "same sha256" ∪ "same
duplicate cluster" (retinabench.data.duplicates; near duplicates join unless ``near=False``). A group is placed
whole, so no patient and no exact (or near) duplicate can be in two splits. An image without a patient id is its
own group (merged with its duplicates), which the report notes. A group's id is the smallest of its members'
keys (``p:<patient id>``, or ``i:<image id>`` without one), so it does not depend on any other group.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from retinabench.schemas import SPLITS


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


def check_fractions(fractions: dict[str, float]) -> dict[str, float]:
    missing = [s for s in SPLITS if s not in fractions]
    if missing:
        raise SplitError(f"split fractions {fractions} lack {missing}")
    if any(not 0 < fractions[s] < 1 for s in SPLITS):
        raise SplitError(f"split fractions must each be in (0, 1), got {fractions}")
    total = sum(fractions[s] for s in SPLITS)
    if abs(total - 1.0) > 1e-6:
        raise SplitError(f"split fractions must sum to 1, got {fractions} (sum {total:g})")
    return {s: float(fractions[s]) for s in SPLITS}


def _components(n: int, links: list[np.ndarray]) -> np.ndarray:
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    i = np.concatenate([np.arange(n)] + [np.arange(n)] * len(links))
    j = np.concatenate([np.arange(n)] + links)
    graph = coo_matrix((np.ones(len(i), dtype=np.int8), (i, j)), shape=(n, n))
    return connected_components(graph, directed=False)[1]


def _first_of(codes: np.ndarray) -> np.ndarray:
    """For each row, the first row with the same code (itself where the code is -1: no link)."""
    s = pd.Series(np.arange(len(codes)))
    first = s.groupby(codes).transform("min").to_numpy()
    return np.where(codes < 0, np.arange(len(codes)), first)


def split_groups(manifest: pd.DataFrame, duplicates: pd.DataFrame | None = None, *, near: bool = True
                 ) -> tuple[pd.DataFrame, dict]:
    """``image_id, patient_id, group_id`` per manifest image (sorted by image id) and merge counts."""
    m = manifest.reindex(columns=["image_id", "patient_id", "sha256"])  # sha256 may be absent (tables built by hand)
    m = m.sort_values("image_id", kind="stable").reset_index(drop=True)
    if m["image_id"].duplicated().any():
        first = m.loc[m["image_id"].duplicated(), "image_id"].iloc[0]
        raise SplitError(f"manifest has duplicate image ids, e.g. {first}")
    pid = m["patient_id"].astype("string")
    pid = pid.where(pid.str.strip().fillna("") != "", pd.NA)
    key = ("p:" + pid).fillna("i:" + m["image_id"])
    patient_link = _first_of(pd.factorize(pid, use_na_sentinel=True)[0])
    sha_link = _first_of(pd.factorize(m["sha256"].astype("string"), use_na_sentinel=True)[0])
    links = [patient_link, sha_link]
    n_near_links = 0
    if duplicates is not None and len(duplicates):
        d = duplicates if near else duplicates[duplicates["kind"] == "exact"]
        cluster = m["image_id"].map(dict(zip(d["image_id"], d["cluster_id"])))
        links.append(_first_of(pd.factorize(cluster, use_na_sentinel=True)[0]))
        n_near_links = int((d["kind"] == "near").sum())
    comp_pe = _components(len(m), links[:2])
    comp = _components(len(m), links)
    group = key.groupby(comp).transform("min")
    out = pd.DataFrame({"image_id": m["image_id"], "patient_id": pid, "group_id": group.astype(str)})

    def spanning(c):
        per = key[pid.notna()].groupby(c[pid.notna().to_numpy()]).nunique()
        return per[per > 1]

    merged, merged_exact = spanning(comp), spanning(comp_pe)
    report: dict[str, Any]  # counts, and a note where images have no patient id
    report = {"n_images": int(len(m)), "n_patients": int(pid.nunique()), "n_groups": int(out["group_id"].nunique()),
              "groups_merging_patients": int(len(merged)), "patients_in_merged_groups": int(merged.sum()),
              "groups_merging_patients_by_exact_duplicates": int(len(merged_exact)),
              "near_duplicate_images_grouped": n_near_links if near else 0,
              "images_without_patient_id": int(pid.isna().sum()),
              "largest_group_images": int(out["group_id"].value_counts().max()) if len(out) else 0}
    if report["images_without_patient_id"]:
        report["note"] = (f"{report['images_without_patient_id']} images have no patient id: each is its own group "
                          f"(merged with its duplicates), so images of one unrecorded patient may be in two splits")
    return out, report


def check_assignment(assignment: pd.DataFrame, manifest: pd.DataFrame) -> None:
    """Fail loudly on a patient, a group or an exact duplicate (sha256) in two splits."""
    a = assignment.merge(manifest.reindex(columns=["image_id", "sha256"]), on="image_id", how="left")
    for col, what in (("patient_id", "patient"), ("group_id", "group"), ("sha256", "identical image (sha256)")):
        per = a.dropna(subset=[col]).groupby(col)["split"].nunique()
        bad = per[per > 1]
        if len(bad):
            key = bad.index[0]
            rows = a[a[col] == key]
            raise SplitError(f"{what} {key} is in splits {sorted(rows['split'].unique())} (images "
                             f"{sorted(rows['image_id'])[:5]}; {len(bad)} such)")
