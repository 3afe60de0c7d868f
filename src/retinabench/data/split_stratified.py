"""``split.method: stratified_grouped``: label-stratified, patient-grouped, duplicate-aware placement that stays
stable when a patient is added or removed.

**Strata.** Each group (patient ∪ duplicate cluster, retinabench.data.split_groups) gets a label profile: for
every registry task of the dataset (sorted by name) its *worst* label among the group's images of that task — the
class listed last in the task's ``classes`` (the most severe grade of an ordinal task, the positive class of a
binary one; for a nominal task the last listed) — or ``-`` when the group has no labelled image of the task. The
profile depends on the group's own images only. A group's stratum is the longest prefix of its profile shared by
at least :data:`MIN_STRATUM` groups (the first task's label alone if even that prefix is rarer: a profile made of
every task's label is too fine for datasets with many tasks); the groups left over at a prefix form one stratum.

**Placement: systematic sampling with a random start per stratum.** Within a stratum, groups are ordered by
their seeded hash ``u`` (the hash method's number); each group's position is the midpoint of its share of the
stratum's images in that order, plus a start offset hashed from the seed and the stratum key, modulo 1; then
train if the position is below 0.70, val below 0.85, test otherwise (the configured fractions). Every stratum is
thus split 70/15/15 in images to within one group, and a stratum of one or two groups is still placed with the
right probabilities (its random start), so no split is biased. A removed or added group shifts the positions of
its stratum's other groups by at most its share of that stratum's images: only groups that sit next to one of the
three cuts of that one stratum can cross it (measured: docs/data-integrity.md). Groups of other strata never move
(unless the edit changes which prefix a stratum uses: a prefix crossing :data:`MIN_STRATUM` groups).
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from retinabench.data.split_groups import task_rows
from retinabench.hashing import unit_hash

MIN_STRATUM = 5
NONE = "-"


def label_profiles(manifest: pd.DataFrame, groups: pd.DataFrame, tasks: list[dict]) -> dict[str, tuple]:
    """group id -> its worst label per task (tasks sorted by name; ``-`` without a labelled image)."""
    gid = dict(zip(groups["image_id"], groups["group_id"]))
    names = sorted(t["name"] for t in tasks)
    columns: dict[str, dict] = {}
    for task in sorted(tasks, key=lambda t: t["name"]):
        rows, _ = task_rows(manifest, task)
        rank = {c: i for i, c in enumerate(task["classes"])}
        worst = pd.Series(rows[task["label"]].map(rank).to_numpy(), index=rows["image_id"].map(gid).to_numpy())
        worst = worst.groupby(level=0).max()
        columns[task["name"]] = {g: task["classes"][int(k)] for g, k in worst.items()}
    return {g: tuple(columns[n].get(g, NONE) for n in names) for g in sorted(set(groups["group_id"]))}


def strata(profiles: dict[str, tuple], min_groups: int = MIN_STRATUM) -> dict[str, tuple]:
    """group id -> its stratum: the longest prefix of its profile held by >= ``min_groups`` groups (>= 1 task)."""
    counts: Counter = Counter()
    for p in profiles.values():
        for k in range(1, len(p) + 1):
            counts[p[:k]] += 1
    out = {}
    for g, p in profiles.items():
        k = len(p)
        while k > 1 and counts[p[:k]] < min_groups:
            k -= 1
        out[g] = p[:k]
    return out


def stratified_positions(sizes: pd.Series, stratum_of: dict[str, tuple], u: dict[str, float], seed: int,
                         salt: str) -> dict[str, float]:
    """group id -> position in [0, 1): systematic sampling with a seeded random start within each stratum."""
    by_stratum: dict[tuple, list] = {}
    for g in sizes.index:
        by_stratum.setdefault(stratum_of[g], []).append(g)
    pos: dict[str, float] = {}
    for key, members in by_stratum.items():
        order = sorted(members, key=lambda g: (u[g], g))
        n = np.array([sizes[g] for g in order], dtype=float)
        mid = (np.cumsum(n) - n / 2) / n.sum()
        start = unit_hash(salt, "stratum", seed, *key)
        pos.update(zip(order, (mid + start) % 1.0))
    return pos


def label_deviation(manifest: pd.DataFrame, assignment: pd.DataFrame, tasks: list[dict]) -> dict[str, float]:
    """task -> the largest |share of a class in a split − its share in the task|, over splits and classes."""
    split = dict(zip(assignment["image_id"], assignment["split"]))
    out = {}
    for task in sorted(tasks, key=lambda t: t["name"]):
        rows, _ = task_rows(manifest, task)
        s = rows["image_id"].map(split)
        overall = rows[task["label"]].value_counts(normalize=True)
        per = pd.crosstab(s, rows[task["label"]], normalize="index").reindex(columns=overall.index, fill_value=0.0)
        out[task["name"]] = round(float((per - overall).abs().to_numpy().max()), 4) if len(per) else 0.0
    return out
