"""Encoder ranks per (task, protocol, regime) on a metric averaged over seeds (lower rank = better, ties
averaged), and the mean rank ± sd across tasks — the benchmark's primary aggregate."""
from __future__ import annotations

import pandas as pd
from scipy.stats import rankdata

RANK_KEYS = ["task", "protocol", "regime"]


def seed_means(metrics: pd.DataFrame, metric: str = "accuracy", split: str = "test") -> pd.DataFrame:
    sel = metrics[(metrics["metric"] == metric) & (metrics["split"] == split)]
    if sel.empty:
        raise ValueError(f"no {split} rows for metric {metric!r} in the metrics table")
    return (sel.groupby(["dataset", *RANK_KEYS, "encoder"], as_index=False)
            .agg(score=("value", "mean"), sd=("value", "std"), n_seeds=("seed", "nunique")))


def rank_table(metrics: pd.DataFrame, metric: str = "accuracy", split: str = "test",
               higher_is_better: bool = True) -> pd.DataFrame:
    means = seed_means(metrics, metric, split)

    def _rank(g: pd.DataFrame) -> pd.DataFrame:
        key = -g["score"] if higher_is_better else g["score"]
        return g.assign(rank=rankdata(key.to_numpy(), method="average"), n_encoders=len(g))

    out = means.groupby(RANK_KEYS, group_keys=False)[means.columns.tolist()].apply(_rank)
    return out.assign(metric=metric).reset_index(drop=True)


def rank_summary(ranks: pd.DataFrame) -> pd.DataFrame:
    """Mean rank ± sd across tasks per (protocol, regime, encoder), ordered best first."""
    out = (ranks.groupby(["protocol", "regime", "encoder"], as_index=False)
           .agg(mean_rank=("rank", "mean"), sd_rank=("rank", "std"), n_tasks=("task", "nunique"),
                mean_score=("score", "mean")))
    return out.sort_values(["protocol", "regime", "mean_rank", "encoder"]).reset_index(drop=True)
