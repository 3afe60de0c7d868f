"""Calibration: ECE (binary on the positive-class probability; top-label for multi-class), reliability-diagram
bins, negative log-likelihood, temperature scaling fitted on validation predictions.

Bins: 10 equal-width bins (:func:`ece_bins`, the one binning of every ECE of the benchmark: point estimates,
bootstrap replicates, reliability diagrams), with edges set by ``reliability.ece_bin_edges``:
``right_closed`` (default) bin i holds (i/10, (i+1)/10] and 0 goes to bin 0; ``focus`` bin i holds
[i/10, (i+1)/10) and 1 goes to the last bin, as FOCUS's ``expected_calibration_error``
(dsrestrepo/FOCUS-Retinal-Benchmark, retina_bench/evaluation/calibration.py: ``min(int(p * n), n - 1)`` after
clipping p to [0, 1]; the same floating-point product, so a probability lands in FOCUS's bin exactly). ECE = sum_b (n_b / n) |mean(target)_b − mean(prob)_b|,
where (target, prob) is (y == positive, p_pos) for binary tasks and (top label correct, top-label confidence)
for multi-class tasks.

Temperature scaling works on the probabilities the predictions schema stores: logits are log p (clipped at
1e-7 so a kNN's hard zero stays finite; a softmax is invariant to the per-row constant this drops), the scaled
probabilities are softmax(log p / T), and T minimises the validation NLL over T in [0.05, 20]. T is fitted only
when every class has at least ``reliability.temperature_min_per_class`` validation rows (default 30): one
parameter fitted by NLL on a handful of positives chases those few rows and made ECE worse on a real public
dataset. Otherwise T is "not fitted" (NaN) with the reason, and no scaled variant is reported.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from retinabench.settings.reliability import ECE_BIN_EDGES

EPS = 1e-7
T_BOUNDS = (0.05, 20.0)
N_BINS = 10
BIN_EDGES = ECE_BIN_EDGES  # reliability.ece_bin_edges
RIGHT_CLOSED, FOCUS = ECE_BIN_EDGES


def ece_bins(prob, n_bins: int = N_BINS, edges: str = RIGHT_CLOSED) -> np.ndarray:
    """Bin of each probability. ``right_closed``: bin i holds (i/n, (i+1)/n], 0 goes to bin 0; ``focus``: bin i
    holds [i/n, (i+1)/n), 1 goes to bin n - 1 (FOCUS's binning, see the module docstring)."""
    prob = np.asarray(prob, dtype=np.float64)
    if edges == RIGHT_CLOSED:
        return np.clip(np.ceil(prob * n_bins).astype(int) - 1, 0, n_bins - 1)
    if edges == FOCUS:
        return np.minimum((np.clip(prob, 0.0, 1.0) * n_bins).astype(int), n_bins - 1)
    raise ValueError(f"ECE bin edges {edges!r} unknown (reliability.ece_bin_edges: one of {', '.join(BIN_EDGES)})")


def binned_calibration_error(target, prob, n_bins: int = N_BINS, edges: str = RIGHT_CLOSED) -> float:
    """Sum over equal-width probability bins of |mean target - mean prob| × bin weight."""
    target = np.asarray(target, dtype=float)
    prob = np.asarray(prob, dtype=float)
    bins = ece_bins(prob, n_bins, edges)
    ece = 0.0
    for b in range(n_bins):
        m = bins == b
        if m.any():
            ece += m.mean() * abs(target[m].mean() - prob[m].mean())
    return float(ece)


def binary_ece(y_true, p_pos, n_bins: int = N_BINS, edges: str = RIGHT_CLOSED) -> float:
    """Positive-class ECE (metric ``ece``): the binned gap between P(y = positive) and p_pos (FOCUS)."""
    y = (np.asarray(y_true) == 1).astype(np.float64)
    if len(y) == 0:
        return float("nan")
    return binned_calibration_error(y, np.asarray(p_pos, dtype=np.float64), n_bins, edges)


def top_label_ece(y_true, proba, n_bins: int = N_BINS, edges: str = RIGHT_CLOSED) -> float:
    """Top-label ECE (metric ``ece_top_label``): the binned gap between top-label accuracy and top-label
    confidence."""
    if len(y_true) == 0:
        return float("nan")
    proba = np.asarray(proba, dtype=np.float64)
    correct = (proba.argmax(axis=1) == np.asarray(y_true)).astype(float)
    return binned_calibration_error(correct, proba.max(axis=1), n_bins, edges)


def calibration_target(y_true, proba) -> tuple[np.ndarray, np.ndarray]:
    """(target, prob) pairs the ECE and reliability diagram use: binary -> (y == 1, p_pos); else top label."""
    y = np.asarray(y_true)
    proba = np.asarray(proba, dtype=np.float64)
    if proba.shape[1] == 2:
        return (y == 1).astype(np.float64), proba[:, 1]
    return (proba.argmax(1) == y).astype(np.float64), proba.max(1)


def ece(y_true, proba, n_bins: int = 10, edges: str = RIGHT_CLOSED) -> float:
    """Binary ECE on p_pos for two classes, top-label ECE otherwise."""
    proba = np.asarray(proba, dtype=np.float64)
    if proba.shape[1] == 2:
        return binary_ece(y_true, proba[:, 1], n_bins, edges)
    return top_label_ece(y_true, proba, n_bins, edges)


def reliability_bins(y_true, proba, n_bins: int = 10, edges: str = RIGHT_CLOSED) -> pd.DataFrame:
    """One row per bin: edges (``lower``/``upper``; which one is closed: ``edges``), count, mean predicted
    probability, observed frequency (NaN for empty bins)."""
    target, prob = calibration_target(y_true, proba)
    bins = ece_bins(prob, n_bins, edges)
    rows = []
    for b in range(n_bins):
        m = bins == b
        rows.append({"bin": b, "lower": b / n_bins, "upper": (b + 1) / n_bins, "n": int(m.sum()),
                     "mean_prob": float(prob[m].mean()) if m.any() else float("nan"),
                     "observed": float(target[m].mean()) if m.any() else float("nan")})
    return pd.DataFrame(rows)


def log_probs(proba) -> np.ndarray:
    p = np.clip(np.asarray(proba, dtype=np.float64), EPS, 1.0)
    return np.log(p / p.sum(axis=1, keepdims=True))


def nll(y_true, proba) -> float:
    y = np.asarray(y_true, dtype=np.int64)
    if len(y) == 0:
        return float("nan")
    return float(-log_probs(proba)[np.arange(len(y)), y].mean())


def apply_temperature(proba, temperature: float) -> np.ndarray:
    from scipy.special import log_softmax  # scipy on use: the metric table (parse time) imports this module
    return np.exp(log_softmax(log_probs(proba) / float(temperature), axis=1))


def temperature_fit_gate(y_val, n_classes: int, min_per_class: int) -> str:
    """Why temperature scaling is not fitted on validation labels ``y_val`` ("" when it is): a class with fewer
    than ``min_per_class`` rows (``reliability.temperature_min_per_class``)."""
    y = np.asarray(y_val, dtype=np.int64)
    if len(y) == 0:
        return "not fitted: no validation rows"
    counts = np.bincount(y[y >= 0], minlength=n_classes)[:n_classes]
    short = [f"class {c}: {int(k)}" for c, k in enumerate(counts) if k < min_per_class]
    if short:
        return (f"not fitted: validation has fewer than {min_per_class} rows of a class ({', '.join(short)}; "
                "reliability.temperature_min_per_class)")
    return ""


def fit_temperature(y_val, proba_val, min_per_class: int = 1) -> tuple[float, str]:
    """Temperature minimising validation NLL, and "" ; (NaN, reason) when it is not fitted (see
    :func:`temperature_fit_gate`): the caller then reports no scaled variant."""
    from scipy.optimize import minimize_scalar
    from scipy.special import log_softmax
    y = np.asarray(y_val, dtype=np.int64)
    proba_val = np.asarray(proba_val, dtype=np.float64)
    why = temperature_fit_gate(y, proba_val.shape[1], min_per_class)
    if why:
        return float("nan"), why
    logits = log_probs(proba_val)
    idx = np.arange(len(y))

    def loss(log_t: float) -> float:
        return float(-log_softmax(logits / np.exp(log_t), axis=1)[idx, y].mean())

    res = minimize_scalar(loss, bounds=tuple(np.log(T_BOUNDS)), method="bounded", options={"xatol": 1e-5})
    if not res.success:
        raise RuntimeError(f"temperature scaling did not converge: {res.message}")
    return float(np.exp(res.x)), ""
