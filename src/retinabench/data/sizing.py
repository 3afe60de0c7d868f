"""Whether a dataset is large enough for what a config asks of it, checked before any job runs: every class of
every task in each of the three splits (a class needs at least as many patient groups as there are splits) and
kNN's ``k`` against the size of each task's training split (full and balanced, as the regimes train on them).

One home for these checks: ``retinabench datasets --check`` runs them on the adapter's rows (before hashing) and
the workflow's start-up checks (:func:`retinabench.plan.selection.data_problems`) on built manifests; both compute
the split with the functions the split jobs use (:mod:`retinabench.data.splits`).
"""
from __future__ import annotations

import pandas as pd

from retinabench.data.splits import SplitError, assign_splits, task_split
from retinabench.regimes import is_balanced, train_sides


def sizing_problems(manifest: pd.DataFrame, dataset: str, dataset_tasks: list[dict], checked: list[dict], *,
                    split: dict, knn_k: int | str | None, regimes: list[str],
                    duplicates: pd.DataFrame | None = None) -> list[str]:
    """One line per problem, each naming the dataset, the task, the split and (for kNN) k.

    ``dataset_tasks``: every registry task of the dataset (its one split assignment keeps all their classes in
    every split); ``checked``: the tasks the config runs; ``split``: the config's ``split`` section; ``knn_k``:
    the config's ``knn.k`` when kNN runs (``auto`` or None: nothing to check)."""
    try:
        assignment, _ = assign_splits(manifest, dataset_tasks, fractions=split["fractions"], seed=split["seed"],
                                      duplicates=duplicates, near=split["group_near_duplicates"],
                                      method=split["method"], dataset=dataset, file=split.get("file"))
    except SplitError as err:
        return [f"dataset {dataset!r}: {err}"]
    problems = []
    for task in checked:
        try:
            rows = task_split(manifest, assignment, task, seed=split["seed"])
        except SplitError as err:
            problems.append(f"dataset {dataset!r}: {err}")
            continue
        if not isinstance(knn_k, int):
            continue
        train = rows[rows["split"] == "train"]
        for side in train_sides(regimes):
            n = int(train["balanced"].sum() if is_balanced(side) else len(train))
            if knn_k > n:
                which = "balanced" if is_balanced(side) else "full"
                problems.append(f"dataset {dataset!r}: knn.k = {knn_k} but task {task['name']!r} has {n} training "
                                f"images in the {which} training set (split 'train', regimes {side}-*); lower "
                                f"knn.k, set `k: auto`, or add images")
    return problems
