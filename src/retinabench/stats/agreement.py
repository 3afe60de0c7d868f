"""Agreement between encoder rankings of different conditions (protocols, data regimes): Spearman's rho.

An encoder's ranking under a condition is its mean rank across tasks (lower = better); two conditions agree
when they order the encoders alike. rho and its two-sided p-value come from :func:`scipy.stats.spearmanr`.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from retinabench.regimes import BALANCED, UNBALANCED
from retinabench.stats.ranks import select


EXACT_MAX_N = 8  # up to 8! = 40320 pairings the permutation p-value is exact and fast


def spearman(a: pd.Series, b: pd.Series) -> tuple[float, float, str]:
    """rho, two-sided p and a note saying how p was obtained.

    rho is :func:`scipy.stats.spearmanr`'s. Its p-value uses a t approximation that is poor for few encoders
    (rho = 1 on 3 encoders gives p = 0), so up to ``EXACT_MAX_N`` encoders p comes from an exact permutation
    test (:func:`scipy.stats.permutation_test` over all pairings, statistic = Pearson r of the ranks, i.e. rho).
    rho is undefined (NaN, noted) when either ranking is constant.
    """
    if set(a.index) != set(b.index):
        raise ValueError(f"spearman: the rankings cover different encoders: {sorted(set(a.index) ^ set(b.index))}")
    if len(a) < 3:
        raise ValueError(f"spearman: needs at least 3 encoders, got {len(a)}")
    x, y = a.to_numpy(dtype=float), b.loc[a.index].to_numpy(dtype=float)
    with warnings.catch_warnings():
        warnings.simplefilter("error", stats.ConstantInputWarning)
        try:
            res = stats.spearmanr(x, y)
        except stats.ConstantInputWarning:
            return float("nan"), float("nan"), "constant ranking: rho undefined"
    if len(x) > EXACT_MAX_N:
        return float(res.statistic), float(res.pvalue), "p: t approximation"
    ry = stats.rankdata(y)

    def rho(xs, axis=-1):
        return stats.pearsonr(stats.rankdata(xs, axis=axis), np.broadcast_to(ry, np.shape(xs)), axis=axis).statistic

    perm = stats.permutation_test((x,), rho, permutation_type="pairings", n_resamples=np.inf, vectorized=True,
                                  alternative="two-sided")
    return float(res.statistic), float(min(1.0, perm.pvalue)), "p: exact permutation"


def condition_rankings(ranks: pd.DataFrame, *, metric: str, by: str, fixed: dict[str, Any],
                       keep: list[str] | None = None) -> pd.DataFrame:
    """Encoders × conditions matrix of mean ranks, the conditions being the values of column ``by`` (only those
    in ``keep`` when given, e.g. the protocols run on every encoder and task)."""
    d = select(ranks, metric=metric, **fixed)
    if keep is not None:
        d = d[d[by].isin(keep)]
    out = d.groupby(["encoder", by])["rank"].mean().unstack(by)
    if out.isna().to_numpy().any():
        raise ValueError(f"condition_rankings: some encoders lack ranks under some {by} ({fixed}): "
                         f"{out.isna().sum().to_dict()}")
    return out


def spearman_matrix(rankings: pd.DataFrame, order: list[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Pairwise rho and p between the columns (conditions) of an encoders × conditions matrix."""
    cols = list(order) if order is not None else list(rankings.columns)
    missing = [c for c in cols if c not in rankings.columns]
    if missing:
        raise KeyError(f"spearman_matrix: conditions {missing} not in {list(rankings.columns)}")
    rho = pd.DataFrame(np.eye(len(cols)), index=cols, columns=cols)
    p = pd.DataFrame(np.zeros((len(cols), len(cols))), index=cols, columns=cols)
    for i, a in enumerate(cols):
        for b in cols[i + 1:]:
            r, pv, _ = spearman(rankings[a], rankings[b])
            rho.loc[a, b] = rho.loc[b, a] = r
            p.loc[a, b] = p.loc[b, a] = pv
    return rho, p


def agreement_table(ranks: pd.DataFrame, *, metric: str, protocols: list[str], regimes: list[str],
                    alpha: float = 0.05) -> pd.DataFrame:
    """Tidy Spearman table: protocol pairs within the unbalanced (u-u) and balanced (b-b) regimes, and regime
    pairs within each protocol. Columns: kind, within, a, b, rho, p, n_encoders, significant, note."""
    rows = []
    if len(protocols) >= 2:
        for regime in [r for r in (UNBALANCED, BALANCED) if r in regimes]:
            m = condition_rankings(ranks, metric=metric, by="protocol", fixed={"regime": regime}, keep=protocols)
            rows += _pairs(m, protocols, "protocols", regime, alpha)
    if len(regimes) >= 2:
        for protocol in protocols:
            m = condition_rankings(ranks, metric=metric, by="regime", fixed={"protocol": protocol}, keep=regimes)
            rows += _pairs(m, regimes, "regimes", protocol, alpha)
    if not rows:
        raise ValueError(f"agreement_table: nothing to compare with protocols {protocols} and regimes {regimes}")
    return pd.DataFrame(rows).assign(metric=metric)


def _pairs(m: pd.DataFrame, conditions: list[str], kind: str, within: str, alpha: float) -> list[dict]:
    missing = [c for c in conditions if c not in m.columns]
    if missing:
        raise ValueError(f"agreement: no ranks for {kind} {missing} within {within}; have {list(m.columns)}")
    rows = []
    for i, a in enumerate(conditions):
        for b in conditions[i + 1:]:
            rho, p, note = spearman(m[a], m[b])
            rows.append({"kind": kind, "within": within, "a": a, "b": b, "rho": rho, "p": p, "n_encoders": len(m),
                         "significant": bool(p < alpha) if p == p else False, "note": note})
    return rows
