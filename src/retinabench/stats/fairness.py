"""Subgroup performance (fairness): per encoder, a metric on one subgroup against another.

Expected input (written by the subgroup-metrics stage): the METRICS columns plus ``attribute`` (e.g. ``age``,
``sex``) and ``group`` (e.g. ``<60``, ``>=60``, ``female``, ``male``). Each encoder's value per group is the
mean over seeds, then over tasks that have both groups of the pair.
"""
from __future__ import annotations

import pandas as pd

from retinabench.schemas import METRICS

SUBGROUP_COLUMNS = [*METRICS.names, "attribute", "group"]


def check_subgroups(table: pd.DataFrame) -> None:
    missing = [c for c in SUBGROUP_COLUMNS if c not in table.columns]
    if missing:
        raise KeyError(f"subgroup metrics table lacks column(s) {missing}; expected {SUBGROUP_COLUMNS}")


def subgroup_pairs(table: pd.DataFrame, pairs: dict[str, list[str]], *, metric: str = "accuracy",
                   protocol: str, regime: str, split: str = "test") -> pd.DataFrame:
    """Per (attribute, encoder): the two groups' values, their difference (b − a) and the task count."""
    check_subgroups(table)
    d = table[(table["metric"] == metric) & (table["protocol"] == protocol) & (table["regime"] == regime)
              & (table["split"] == split)]
    rows = []
    for attribute, groups in pairs.items():
        if len(groups) != 2:
            raise ValueError(f"subgroup pair for {attribute!r} must name two groups, got {groups}")
        a, b = groups
        da = d[d["attribute"] == attribute]
        have = set(da["group"])
        missing = [g for g in (a, b) if g not in have]
        if missing:
            raise ValueError(f"subgroup metrics: attribute {attribute!r} has no {split} {metric} rows for "
                             f"group(s) {missing} (protocol {protocol!r}, regime {regime!r}); groups present: "
                             f"{sorted(have)}")
        per_task = da.groupby(["encoder", "task", "group"])["value"].mean().unstack("group")[[a, b]].dropna()
        g = per_task.groupby("encoder")
        out = pd.DataFrame({"value_a": g[a].mean(), "value_b": g[b].mean(), "n_tasks": g.size()}).reset_index()
        rows.append(out.assign(attribute=attribute, group_a=a, group_b=b))
    out = pd.concat(rows, ignore_index=True)
    out["difference"] = out["value_b"] - out["value_a"]
    return out.assign(metric=metric, protocol=protocol, regime=regime, split=split)[
        ["attribute", "group_a", "group_b", "encoder", "value_a", "value_b", "difference", "n_tasks", "metric",
         "protocol", "regime", "split"]]
