"""Patient-clustered bootstrap tests: p-values, Benjamini–Hochberg, the two-stage (hierarchical) bootstrap of a
mean over comparisons and FOCUS's one-stage one. The resampling weights, the weighted metric kernels and percentile CIs are in
retinabench.metrics.weighted (re-exported here).
"""
from __future__ import annotations

import numpy as np
from scipy.stats import false_discovery_control

from retinabench.metrics.weighted import (BINARY_METRICS, MULTICLASS_METRICS, _quiet,  # noqa: F401 (re-exported)
                                          cluster_codes, cluster_resample_indices, cluster_weights,
                                          draw_cluster_counts, ece_bins, make_rng, percentile_ci, w_auroc,
                                          w_average_precision, w_ece, w_mean, weighted_metrics)


def bootstrap_p_value(reps, null: float = 0.0) -> float:
    """Two-sided bootstrap p-value for H0: statistic = null, from the replicates' position relative to null:
    p = min(1, 2 min((1 + #{d* <= null}) / (B + 1), (1 + #{d* >= null}) / (B + 1))) over finite replicates."""
    reps = np.asarray(reps, dtype=np.float64)
    ok = reps[np.isfinite(reps)]
    if ok.size == 0:
        return float("nan")
    b = ok.size
    lower = (1 + np.count_nonzero(ok <= null)) / (b + 1)
    upper = (1 + np.count_nonzero(ok >= null)) / (b + 1)
    return float(min(1.0, 2.0 * min(lower, upper)))


def benjamini_hochberg(p_values) -> np.ndarray:
    """BH-adjusted p-values (scipy.stats.false_discovery_control); NaN p-values stay NaN and are not counted."""
    p = np.asarray(p_values, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.isfinite(p)
    if ok.any():
        out[ok] = false_discovery_control(p[ok], method="bh")
    return out


def hierarchical_mean_replicates(replicates: list[np.ndarray], rng: np.random.Generator,
                                 n_boot: int | None = None) -> np.ndarray:
    """Replicates of the mean over comparisons, resampling the comparisons too (two-stage bootstrap):
    replicate b averages, over k comparisons drawn with replacement, each drawn comparison's own replicate b.
    Captures both image-level and comparison-to-comparison variation of a domain-level mean delta."""
    if not replicates:
        raise ValueError("hierarchical bootstrap: no comparisons")
    R = np.stack([np.asarray(r, dtype=np.float64) for r in replicates])  # (k, B)
    k, b = R.shape
    n_boot = n_boot or b
    picks = rng.integers(0, k, size=(n_boot, k))
    cols = np.arange(n_boot) % b
    with _quiet():
        return np.nanmean(R[picks, cols[:, None]], axis=1)


def one_stage_mean_replicates(deltas, rng: np.random.Generator, n_boot: int) -> np.ndarray:
    """Replicates of the mean over comparisons, resampling the comparisons' point deltas only (one stage; FOCUS's
    ``summarize_deltas`` in scripts/analyze_ft_significance.py): the non-finite deltas dropped, then replicate b is
    the mean of ``rng.choice(deltas, size=k, replace=True)``, one call per replicate, as FOCUS draws them. Ignores
    each comparison's image-level uncertainty, so its intervals are narrower than the two-stage ones."""
    d = np.asarray(deltas, dtype=np.float64)
    d = d[np.isfinite(d)]
    if d.size == 0:
        raise ValueError("one-stage bootstrap: no finite comparison delta")
    return np.asarray([rng.choice(d, size=d.size, replace=True).mean() for _ in range(int(n_boot))])
