"""Subgroup performance (fairness, OcularBench Figs. 10–11): per encoder and dataset, a metric on one subgroup
against another.

Expected input: the reliability layer's ``reliability/subgroup_metrics.parquet`` (the METRICS columns plus
``attribute`` (e.g. ``age``, ``sex``) and ``group`` (e.g. ``<60``, ``>=60``, ``female``, ``male``), optionally
``below_min_size``) or any table with those columns. Each point is one encoder on one dataset: the mean over seeds,
then over the dataset's tasks that have both groups of the pair.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from retinabench.schemas import METRICS

SUBGROUP_COLUMNS = [*METRICS.names, "attribute", "group"]
PAIR_COLUMNS = ["attribute", "group_a", "group_b", "dataset", "encoder", "value_a", "value_b", "difference",
                "n_tasks", "n_seeds", "small_group", "metric", "protocol", "regime", "split", "reason"]


def check_subgroups(table: pd.DataFrame) -> None:
    missing = [c for c in SUBGROUP_COLUMNS if c not in table.columns]
    if missing:
        raise KeyError(f"subgroup metrics table lacks column(s) {missing}; expected {SUBGROUP_COLUMNS}")


def subgroup_pairs(table: pd.DataFrame, pairs: dict[str, list[str]], *, metric: str = "accuracy",
                   protocol: str, regime: str, split: str = "test") -> pd.DataFrame:
    """Per (attribute, dataset, encoder): the two groups' values, their difference (b − a), the task and seed
    counts, and ``small_group`` (a group below the reliability layer's minimum size). An attribute without rows
    for a group keeps one row whose ``reason`` says so (dataset and encoder empty): never dropped silently."""
    check_subgroups(table)
    d = table[(table["metric"] == metric) & (table["protocol"] == protocol) & (table["regime"] == regime)
              & (table["split"] == split)]
    if "below_min_size" not in d.columns:
        d = d.assign(below_min_size=False)
    rows = []
    for attribute, groups in pairs.items():
        if len(groups) != 2:
            raise ValueError(f"subgroup pair for {attribute!r} must name two groups, got {groups}")
        a, b = groups
        da = d[d["attribute"] == attribute]
        base: dict[str, Any] = {"attribute": attribute, "group_a": a, "group_b": b}
        missing = [g for g in (a, b) if g not in set(da["group"])]
        if missing:
            have = sorted(set(da["group"])) or "none"
            rows.append({**base, "reason": f"no {split} {metric} rows for group(s) {missing} (protocol {protocol!r}, "
                                           f"regime {regime!r}); groups present: {have}"})
            continue
        da = da[da["group"].isin([a, b])]
        per_task = da.groupby(["dataset", "encoder", "task", "group"]).agg(
            value=("value", "mean"), n_seeds=("seed", "nunique"),
            small=("below_min_size", lambda x: bool(pd.Series(x).fillna(False).astype(bool).any())))
        wide = per_task.unstack("group")
        both = wide[("value", a)].notna() & wide[("value", b)].notna()
        if not both.any():
            rows.append({**base, "reason": f"no task has {split} {metric} rows for both {a!r} and {b!r}"})
            continue
        wide = wide[both]
        for (dataset, encoder), w in wide.groupby(level=["dataset", "encoder"], sort=True):
            va, vb = float(w[("value", a)].mean()), float(w[("value", b)].mean())
            rows.append({**base, "dataset": dataset, "encoder": encoder, "value_a": va, "value_b": vb,
                         "difference": vb - va, "n_tasks": int(len(w)),
                         "n_seeds": int(np.nanmin(w[[("n_seeds", a), ("n_seeds", b)]].to_numpy())),
                         "small_group": bool(w[[("small", a), ("small", b)]].to_numpy().any()), "reason": ""})
    out = pd.DataFrame(rows, columns=PAIR_COLUMNS)
    return out.assign(metric=metric, protocol=protocol, regime=regime, split=split)[PAIR_COLUMNS]
