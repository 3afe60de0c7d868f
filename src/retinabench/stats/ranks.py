"""Encoder ranks per (task, protocol, regime) on a metric averaged over seeds (lower rank = better, ties
averaged), and the mean rank ± sd across tasks — the benchmark's primary aggregate."""
from __future__ import annotations

import pandas as pd
from scipy.stats import rankdata

from retinabench.metrics.table import higher_is_better  # noqa: F401 (re-exported: the ranks' direction)

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


# --- extensions for the analysis layer -------------------------------------------------------------------------

def rank_tables(metrics: pd.DataFrame, metric_names: list[str], split: str = "test") -> pd.DataFrame:
    """:func:`rank_table` for several ranking metrics at once (column ``metric`` tells them apart)."""
    if not metric_names:
        raise ValueError("rank_tables: no ranking metrics given")
    frames = [rank_table(metrics, metric=m, split=split, higher_is_better=higher_is_better(m))
              for m in dict.fromkeys(metric_names)]
    return pd.concat(frames, ignore_index=True)


def rank_summaries(ranks: pd.DataFrame) -> pd.DataFrame:
    """:func:`rank_summary` per ranking metric (``metric`` first column), best first within each block."""
    _require(ranks, ["metric"], "ranks")
    frames = [rank_summary(g).assign(metric=m) for m, g in ranks.groupby("metric", sort=False)]
    out = pd.concat(frames, ignore_index=True)
    return out[["metric", *[c for c in out.columns if c != "metric"]]]


def _require(df: pd.DataFrame, columns: list[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise KeyError(f"{what} table lacks column(s) {missing}; has {list(df.columns)}")


def select(ranks: pd.DataFrame, *, metric: str | None = None, protocol: str | None = None,
           regime: str | None = None, tasks: list[str] | None = None) -> pd.DataFrame:
    """Rows of a rank table for one metric / protocol / regime (each optional); error when nothing matches."""
    _require(ranks, ["task", "protocol", "regime", "encoder", "rank"], "ranks")
    sel = pd.Series(True, index=ranks.index)
    for col, value in (("metric", metric), ("protocol", protocol), ("regime", regime)):
        if value is not None:
            _require(ranks, [col], "ranks")
            sel &= ranks[col] == value
    if tasks is not None:
        sel &= ranks["task"].isin(list(tasks))
    out = ranks[sel]
    if out.empty:
        raise ValueError(f"no ranks for metric={metric!r} protocol={protocol!r} regime={regime!r}"
                         f"{'' if tasks is None else f' tasks={sorted(tasks)}'}; the table has metrics "
                         f"{sorted(ranks.get('metric', pd.Series(dtype=str)).unique())}, protocols "
                         f"{sorted(ranks['protocol'].unique())}, regimes {sorted(ranks['regime'].unique())}")
    return out


def mean_ranks(ranks: pd.DataFrame, **where) -> pd.Series:
    """Mean rank across tasks per encoder (index: encoder), for the rows :func:`select` picks."""
    return select(ranks, **where).groupby("encoder")["rank"].mean()


def score_matrix(ranks: pd.DataFrame, *, metric: str, protocol: str, regime: str,
                 tasks: list[str] | None = None) -> pd.DataFrame:
    """Tasks × encoders matrix of seed-mean scores; every task must have every encoder (a complete block design)."""
    d = select(ranks, metric=metric, protocol=protocol, regime=regime, tasks=tasks)
    m = d.pivot_table(index="task", columns="encoder", values="score", aggfunc="first").sort_index()
    m = m[sorted(m.columns)]
    holes = m.isna()
    if holes.to_numpy().any():
        missing = [f"{t}/{e}" for t, e in holes.stack().loc[lambda s: s].index]
        raise ValueError(f"score matrix {metric}/{protocol}/{regime} is incomplete (missing task/encoder cells, e.g. "
                         f"{missing[:5]}): rank tests need every encoder on every task")
    return m


def positions(mean_rank: pd.Series) -> pd.Series:
    """Position of each encoder in a ranking by mean rank (1 = best, ties averaged)."""
    return pd.Series(rankdata(mean_rank.to_numpy(), method="average"), index=mean_rank.index)


def encoder_order(ranks: pd.DataFrame, *, metric: str, regime: str) -> list[str]:
    """One encoder order for every figure: mean rank over all tasks and protocols (then name), best first."""
    d = select(ranks, metric=metric, regime=regime)
    mean = d.groupby("encoder")["rank"].mean()
    return sorted(mean.index, key=lambda e: (mean[e], e))
