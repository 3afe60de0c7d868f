"""Classification metrics from predictions: accuracy, balanced accuracy, macro AUROC (one-vs-rest), macro AUPRC
(average precision), macro F1, Cohen's kappa (quadratic for ordinal tasks), top-label ECE (10 equal-width bins).

For binary tasks AUROC and AUPRC use the positive (second) class's probability, which is what their macro
one-vs-rest forms reduce to for AUROC; for AUPRC it is the standard binary average precision.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn import metrics as skm

GROUP_KEYS = ["dataset", "task", "encoder", "protocol", "seed", "regime", "split"]
METRIC_NAMES = ("accuracy", "balanced_accuracy", "auroc", "auprc", "f1_macro", "kappa", "ece")


def binned_calibration_error(target: np.ndarray, prob: np.ndarray, n_bins: int = 10) -> float:
    """Sum over equal-width probability bins of |mean target - mean prob| × bin weight.

    Bin i holds (i/n, (i+1)/n]; a probability of 0 goes to bin 0.
    """
    target = np.asarray(target, dtype=float)
    prob = np.asarray(prob, dtype=float)
    bins = np.clip(np.ceil(prob * n_bins).astype(int) - 1, 0, n_bins - 1)
    ece = 0.0
    for b in range(n_bins):
        m = bins == b
        if m.any():
            ece += m.mean() * abs(target[m].mean() - prob[m].mean())
    return float(ece)


def expected_calibration_error(y_true: np.ndarray, proba: np.ndarray, n_bins: int = 10) -> float:
    """Top-label ECE: the binned gap between top-label accuracy and top-label confidence."""
    correct = (proba.argmax(axis=1) == y_true).astype(float)
    return binned_calibration_error(correct, proba.max(axis=1), n_bins)


def classification_metrics(y_true: np.ndarray, proba: np.ndarray, *, ordinal: bool) -> dict[str, float]:
    y_true = np.asarray(y_true)
    proba = np.asarray(proba, dtype=float)
    n_classes = proba.shape[1]
    y_pred = proba.argmax(axis=1)
    labels = np.arange(n_classes)
    present = np.unique(y_true)
    out = {
        "accuracy": skm.accuracy_score(y_true, y_pred),
        "balanced_accuracy": skm.balanced_accuracy_score(y_true, y_pred),
        "f1_macro": skm.f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0),
        "kappa": skm.cohen_kappa_score(y_true, y_pred, labels=labels, weights="quadratic" if ordinal else None),
        "ece": expected_calibration_error(y_true, proba),
    }
    if len(present) < 2:  # ranking metrics are undefined with one class present
        out["auroc"] = out["auprc"] = float("nan")
    elif n_classes == 2:
        out["auroc"] = skm.roc_auc_score(y_true, proba[:, 1])
        out["auprc"] = skm.average_precision_score(y_true, proba[:, 1])
    else:
        onehot = np.eye(n_classes)[y_true]
        cols = [k for k in labels if onehot[:, k].any()]  # a class absent from y_true has no OvR curve
        out["auroc"] = skm.roc_auc_score(onehot[:, cols], proba[:, cols], average="macro")
        out["auprc"] = skm.average_precision_score(onehot[:, cols], proba[:, cols], average="macro")
    return {k: float(v) for k, v in out.items()}


def metrics_table(predictions: pd.DataFrame, tasks: dict[str, dict]) -> pd.DataFrame:
    """Tidy metrics (one row per group × metric) from a predictions table of any protocol."""
    rows = []
    for key, grp in predictions.groupby(GROUP_KEYS, sort=True):
        task = tasks[key[1]]
        pcols = [f"p_{c}" for c in task["classes"]]
        missing = [c for c in pcols if c not in grp.columns]
        if missing:
            raise KeyError(f"predictions for task {key[1]} lack probability columns {missing}")
        values = classification_metrics(grp["y_true"].to_numpy(), grp[pcols].to_numpy(), ordinal=task["ordinal"])
        base = dict(zip(GROUP_KEYS, key))
        for metric in METRIC_NAMES:
            rows.append({**base, "metric": metric, "value": values[metric], "n": len(grp)})
    return pd.DataFrame(rows)
