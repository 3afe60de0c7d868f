"""Friedman test over encoders × tasks, Nemenyi post-hoc and the critical difference (Demšar, JMLR 7, 2006).

The test statistic and p-value are scipy's (:func:`scipy.stats.friedmanchisquare`, which corrects for ties);
the pairwise p-values are scikit-posthocs' :func:`posthoc_nemenyi_friedman`. What neither library computes is
added here: the Iman–Davenport F statistic, Demšar's uncorrected chi² (to compare with the paper) and the
critical difference CD = q_alpha·sqrt(k(k+1)/(6N)), with q_alpha from the studentized range distribution.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
import scikit_posthocs as sp
from scipy import stats


def q_alpha(k: int, alpha: float = 0.05) -> float:
    """Nemenyi critical value: studentized range quantile for k groups, infinite df, divided by sqrt(2)."""
    if k < 2:
        raise ValueError(f"q_alpha needs at least 2 groups, got k={k}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    return float(stats.studentized_range.ppf(1 - alpha, k, np.inf) / math.sqrt(2))


def critical_difference(k: int, n: int, alpha: float = 0.05) -> float:
    """Nemenyi critical difference of mean ranks for k treatments compared on n blocks (tasks)."""
    if n < 1:
        raise ValueError(f"critical difference needs at least one block, got n={n}")
    return q_alpha(k, alpha) * math.sqrt(k * (k + 1) / (6.0 * n))


@dataclass
class FriedmanResult:
    n: int                    # blocks (tasks)
    k: int                    # treatments (encoders)
    chi2: float               # scipy's statistic (tie-corrected)
    p: float
    F: float                  # Iman–Davenport F from chi2, df (k-1, (k-1)(n-1))
    p_F: float
    chi2_uncorrected: float   # Demšar's eq. from mean ranks, no tie correction
    F_uncorrected: float
    cd: float                 # Nemenyi critical difference at alpha
    alpha: float
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def block_ranks(scores: pd.DataFrame, higher_is_better: bool = True) -> pd.DataFrame:
    """Rank treatments within each block (row): 1 = best, ties averaged."""
    values = scores.to_numpy(dtype=float)
    r = stats.rankdata(-values if higher_is_better else values, axis=1, method="average")
    return pd.DataFrame(r, index=scores.index, columns=scores.columns)


def _iman_davenport(chi2: float, n: int, k: int) -> tuple[float, float]:
    denom = n * (k - 1) - chi2
    if denom <= 0:  # every block ranks the treatments identically: F is unbounded
        return math.inf, 0.0
    F = (n - 1) * chi2 / denom
    return float(F), float(stats.f.sf(F, k - 1, (k - 1) * (n - 1)))


def _check_matrix(scores: pd.DataFrame, what: str) -> None:
    if not isinstance(scores, pd.DataFrame):
        raise TypeError(f"{what}: expected a blocks × treatments DataFrame, got {type(scores).__name__}")
    n, k = scores.shape
    if k < 3:
        raise ValueError(f"{what}: the Friedman test needs at least 3 encoders, got {k} ({list(scores.columns)})")
    if n < 2:
        raise ValueError(f"{what}: the Friedman test needs at least 2 tasks, got {n}")
    if scores.isna().to_numpy().any():
        raise ValueError(f"{what}: the score matrix has missing values; every encoder needs a score on every task")


def friedman_test(scores: pd.DataFrame, *, higher_is_better: bool = True, alpha: float = 0.05) -> FriedmanResult:
    """Friedman test on a blocks (tasks) × treatments (encoders) matrix of scores."""
    _check_matrix(scores, "friedman_test")
    n, k = scores.shape
    mean_rank = block_ranks(scores, higher_is_better).mean(axis=0).to_numpy()
    chi2_unc = 12.0 * n / (k * (k + 1)) * (float(np.sum(mean_rank ** 2)) - k * (k + 1) ** 2 / 4.0)
    F_unc, _ = _iman_davenport(chi2_unc, n, k)
    constant_blocks = int((scores.nunique(axis=1) == 1).sum())
    if constant_blocks == n:
        # scipy divides 0 by 0 here; the honest answer is "no evidence of any difference".
        return FriedmanResult(n, k, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, critical_difference(k, n, alpha), alpha,
                              note="all encoders tie on every task")
    res = stats.friedmanchisquare(*[scores[c].to_numpy(dtype=float) for c in scores.columns])
    chi2 = float(res.statistic)
    F, p_F = _iman_davenport(chi2, n, k)
    note = f"{constant_blocks} task(s) with all encoders tied" if constant_blocks else ""
    return FriedmanResult(n, k, chi2, float(res.pvalue), F, p_F, float(chi2_unc), F_unc,
                          critical_difference(k, n, alpha), alpha, note)


def nemenyi(scores: pd.DataFrame) -> pd.DataFrame:
    """Pairwise Nemenyi p-values (scikit-posthocs), encoders × encoders, labelled like ``scores``' columns."""
    _check_matrix(scores, "nemenyi")
    p = sp.posthoc_nemenyi_friedman(scores.to_numpy(dtype=float))
    p.index = p.columns = list(scores.columns)
    return p


def nemenyi_long(p: pd.DataFrame, mean_rank: pd.Series, alpha: float) -> pd.DataFrame:
    """Upper triangle of a Nemenyi p-value matrix as rows (a, b, mean ranks, p, significant)."""
    rows = []
    names = list(p.index)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            rows.append({"a": a, "b": b, "mean_rank_a": float(mean_rank[a]), "mean_rank_b": float(mean_rank[b]),
                         "p": float(p.loc[a, b]), "significant": bool(p.loc[a, b] < alpha)})
    return pd.DataFrame(rows)
