"""Weighted metric kernels and the patient-clustered resampling weights that drive them, with percentile CIs.

Resampling patients with replacement is the same as giving every patient a multinomial count ``c_p`` (how often
it was drawn) and every image of that patient the weight ``c_p``: all images of a drawn patient come together,
as often as the patient was drawn. A statistic on the resample is then the *weighted* statistic on the original
rows. So one ``(n_boot, n_rows)`` weight matrix drives every metric of every subgroup at once, with no Python
loop over resamples, and group comparisons within one resample stay coupled (same patients drawn).

The weighted kernels here reproduce scikit-learn's definitions exactly (tests check them against sklearn on
rows repeated by integer weights): AUROC = Mann–Whitney with ties counted 1/2, AUPRC = average precision
(step-wise, one step per distinct score), F1 with zero_division=0, ECE with
equal-width bins (calibration.ece_bins: right-closed, or FOCUS's left-closed edges).
Point estimates elsewhere come from scikit-learn; these kernels give the bootstrap replicates. Tests of the
replicates (p-values, Benjamini–Hochberg, the two-stage bootstrap) are in retinabench.stats.bootstrap.
"""
from __future__ import annotations

import zlib
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from retinabench.metrics.calibration import RIGHT_CLOSED, ece_bins
from retinabench.metrics.table import RELIABILITY_BINARY as BINARY_METRICS
from retinabench.metrics.table import RELIABILITY_MULTICLASS as MULTICLASS_METRICS


# ----------------------------------------------------------------------------------------------------------
# seeds and resampling
# ----------------------------------------------------------------------------------------------------------
def make_rng(seed: int, *key: object) -> np.random.Generator:
    """Generator seeded by ``seed`` and a stable hash of ``key`` (so each analysis cell has its own stream,
    independent of the order in which cells are computed and of Python's per-process hash salt)."""
    spawn = tuple(zlib.crc32(str(k).encode()) for k in key)
    return np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=spawn))


def cluster_codes(clusters: Sequence | np.ndarray) -> tuple[np.ndarray, int]:
    """Integer code per row (0..n_clusters-1, in order of first appearance) and the number of clusters."""
    ids = pd.Series(np.asarray(clusters, dtype=object))
    if ids.isna().any():
        raise ValueError(f"cluster bootstrap: {int(ids.isna().sum())} rows have no cluster (patient) id")
    codes, uniques = pd.factorize(ids, sort=False)
    return codes.astype(np.int64), len(uniques)


def draw_cluster_counts(n_clusters: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_boot, n_clusters)`` draw counts: each row is one resample of n_clusters clusters with replacement."""
    if n_clusters < 1:
        raise ValueError("cluster bootstrap: no clusters to resample")
    return rng.multinomial(n_clusters, np.full(n_clusters, 1.0 / n_clusters), size=n_boot)


def cluster_weights(clusters: Sequence | np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_boot, n_rows)`` weights: row i of resample b counts as many times as its cluster was drawn in b."""
    codes, k = cluster_codes(clusters)
    counts = draw_cluster_counts(k, n_boot, rng)
    return counts[:, codes].astype(np.float64)


def cluster_resample_indices(clusters: Sequence, n_boot: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Row indices of each resample (the explicit form of :func:`cluster_weights`, same draws for the same rng
    state): every drawn cluster contributes all of its rows, once per draw."""
    codes, k = cluster_codes(clusters)
    counts = draw_cluster_counts(k, n_boot, rng)
    rows_of = [np.flatnonzero(codes == c) for c in range(k)]
    return [np.concatenate([np.tile(rows_of[c], int(n)) for c, n in enumerate(row) if n] or [np.empty(0, int)])
            for row in counts]


# ----------------------------------------------------------------------------------------------------------
# weighted metric kernels: W is (n_boot, n) or (n,); every kernel returns (n_boot,) (or a scalar for 1-d W)
# ----------------------------------------------------------------------------------------------------------
def _as_2d(W) -> tuple[np.ndarray, bool]:
    W = np.asarray(W, dtype=np.float64)
    return (W[None, :], True) if W.ndim == 1 else (W, False)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def _out(x: np.ndarray, squeeze: bool):
    return float(x[0]) if squeeze else x


def w_mean(x, W):
    W, sq = _as_2d(W)
    return _out(_ratio(W @ np.asarray(x, dtype=np.float64), W.sum(1)), sq)


def w_auroc(y, score, W):
    """Weighted Mann–Whitney AUROC (ties 1/2) = sklearn's roc_auc_score; NaN without both classes."""
    W, sq = _as_2d(W)
    y = np.asarray(y).astype(bool)
    s = np.asarray(score, dtype=np.float64)
    order = np.argsort(s, kind="mergesort")
    ss, yy = s[order], y[order]
    starts = np.flatnonzero(np.r_[True, ss[1:] != ss[:-1]])
    Wo = W[:, order]
    wp = np.add.reduceat(Wo * yy, starts, axis=1)
    wn = np.add.reduceat(Wo * ~yy, starts, axis=1)
    below = np.cumsum(wn, axis=1) - wn
    num = (wp * (below + 0.5 * wn)).sum(1)
    return _out(_ratio(num, wp.sum(1) * wn.sum(1)), sq)


def w_average_precision(y, score, W):
    """Weighted average precision = sklearn's average_precision_score (one step per distinct score)."""
    W, sq = _as_2d(W)
    y = np.asarray(y).astype(bool)
    s = np.asarray(score, dtype=np.float64)
    order = np.argsort(-s, kind="mergesort")
    ss, yy = s[order], y[order]
    starts = np.flatnonzero(np.r_[True, ss[1:] != ss[:-1]])
    Wo = W[:, order]
    wp = np.add.reduceat(Wo * yy, starts, axis=1)
    wn = np.add.reduceat(Wo * ~yy, starts, axis=1)
    tp, fp = np.cumsum(wp, axis=1), np.cumsum(wn, axis=1)
    precision = np.nan_to_num(_ratio(tp, tp + fp))  # a block with no weight adds no recall, so 0 is harmless
    P = wp.sum(1)
    return _out(_ratio((wp * precision).sum(1), P), sq)


def w_ece(target, prob, W, n_bins: int = 10, edges: str = RIGHT_CLOSED):
    """Weighted ECE = sum over bins of |sum w (target - prob)| / sum w (= sum_b n_b/n |acc_b - conf_b|)."""
    W, sq = _as_2d(W)
    d = np.asarray(target, dtype=np.float64) - np.asarray(prob, dtype=np.float64)
    onehot = np.eye(n_bins)[ece_bins(prob, n_bins, edges)]
    per_bin = (W * d) @ onehot
    return _out(_ratio(np.abs(per_bin).sum(1), W.sum(1)), sq)


def _confusion(y, pred, W, positive=1):
    yb, pb = np.asarray(y) == positive, np.asarray(pred) == positive
    return W @ (yb & pb), W @ (~yb & pb), W @ (yb & ~pb), W @ (~yb & ~pb)  # tp, fp, fn, tn


def _f1(tp, fp, fn):
    den = 2 * tp + fp + fn
    return np.where(den > 0, 2 * tp / np.where(den > 0, den, 1.0), 0.0)  # zero_division=0, as sklearn


def weighted_metrics(names: Iterable[str], y, proba, pred, W, *, n_bins: int = 10,
                     edges: str = RIGHT_CLOSED) -> dict[str, np.ndarray]:
    """Bootstrap replicates (n_boot,) of each metric in ``names`` for weights W (n_boot, n).

    Binary names (proba has 2 columns; positive = column 1): auroc, auprc, accuracy, f1, ece (positive-class
    probability), ece_top_label (top-label confidence), ppr (predicted-positive rate), tpr, fpr. Multi-class: auroc_macro, auprc_macro (one-vs-rest
    over classes present), accuracy, f1_macro (all classes), ece_top_label, tpr_macro (macro recall over classes
    present), fpr_macro. Undefined replicates (e.g. no positives drawn) are NaN.
    """
    W, _ = _as_2d(W)
    y = np.asarray(y, dtype=np.int64)
    proba = np.asarray(proba, dtype=np.float64)
    pred = np.asarray(pred, dtype=np.int64)
    k = proba.shape[1]
    out: dict[str, np.ndarray] = {}
    total = W.sum(1)
    for name in names:
        if k == 2 and name in BINARY_METRICS:
            if name == "auroc":
                out[name] = w_auroc(y == 1, proba[:, 1], W)
            elif name == "auprc":
                out[name] = w_average_precision(y == 1, proba[:, 1], W)
            elif name == "accuracy":
                out[name] = _ratio(W @ (pred == y), total)
            elif name == "ece":
                out[name] = w_ece(y == 1, proba[:, 1], W, n_bins, edges)
            elif name == "ece_top_label":
                out[name] = w_ece(proba.argmax(1) == y, proba.max(1), W, n_bins, edges)
            else:
                tp, fp, fn, tn = _confusion(y, pred, W)
                out[name] = {"f1": lambda: _f1(tp, fp, fn), "ppr": lambda: _ratio(tp + fp, total),  # noqa: B023 (called within the iteration)
                             "tpr": lambda: _ratio(tp, tp + fn), "fpr": lambda: _ratio(fp, fp + tn)}[name]()  # noqa: B023 (called within the iteration)
        elif k > 2 and name in MULTICLASS_METRICS:
            if name == "accuracy":
                out[name] = _ratio(W @ (pred == y), total)
            elif name == "ece_top_label":
                out[name] = w_ece(proba.argmax(1) == y, proba.max(1), W, n_bins, edges)
            elif name in ("auroc_macro", "auprc_macro"):
                fn_ = w_auroc if name == "auroc_macro" else w_average_precision
                per = np.stack([fn_(y == c, proba[:, c], W) for c in range(k)], axis=1)
                # classes absent from a resample have no one-vs-rest curve (NaN), as classification.py drops them;
                # with fewer than two classes drawn the macro value is undefined, as for the point estimate
                present = np.stack([(W @ (y == c)) > 0 for c in range(k)], axis=1).sum(1)
                with _quiet():
                    out[name] = np.where(present >= 2, np.nanmean(per, axis=1), np.nan)
            else:
                conf = [_confusion(y, pred, W, positive=c) for c in range(k)]
                if name == "f1_macro":
                    out[name] = np.mean([_f1(tp, fp, fn) for tp, fp, fn, _ in conf], axis=0)
                else:
                    per = np.stack([_ratio(tp, tp + fn) if name == "tpr_macro" else _ratio(fp, fp + tn)
                                    for tp, fp, fn, tn in conf], axis=1)
                    with _quiet():
                        out[name] = np.nanmean(per, axis=1)
        else:
            kind = "binary" if k == 2 else f"{k}-class"
            raise KeyError(f"metric {name!r} is not defined for {kind} tasks; binary: {BINARY_METRICS}, "
                           f"multi-class: {MULTICLASS_METRICS}")
    return out


class _quiet:
    """Silence numpy's 'mean of empty slice' for all-NaN rows (they correctly stay NaN)."""

    def __enter__(self):
        import warnings
        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)




def percentile_ci(reps, level: float = 0.95) -> tuple[float, float, int]:
    """Percentile interval of the finite replicates and how many there were (NaN interval when none)."""
    reps = np.asarray(reps, dtype=np.float64)
    ok = reps[np.isfinite(reps)]
    if ok.size == 0:
        return float("nan"), float("nan"), 0
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(ok, [a, 1.0 - a])
    return float(lo), float(hi), int(ok.size)
