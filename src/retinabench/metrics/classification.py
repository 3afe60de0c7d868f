"""Classification metrics from predictions: accuracy, balanced accuracy, macro AUROC (one-vs-rest), macro AUPRC
(average precision), macro F1, Cohen's kappa (quadratic for ordinal tasks) and calibration error.

Hard-decision metrics (accuracy, balanced accuracy, F1, kappa) come from the ``y_pred`` each protocol wrote, as
written: a protocol whose decision is not the argmax of its probabilities (a parsed MLLM answer, a validation-chosen
threshold) is scored on its own decision. Probability metrics (AUROC, AUPRC, ECE) come from the ``p_<class>``
columns.

ECE vocabulary (the same in every table of the benchmark): ``ece`` is the positive-class ECE of binary tasks (the
binned gap between P(y = positive) and p_pos; FOCUS), ``ece_top_label`` the top-label ECE (top-label accuracy vs
top-label confidence). Binary tasks report both, multi-class tasks ``ece_top_label`` only. Both use 10 equal-width
bins, bin i holding (i/10, (i+1)/10] and 0 going to bin 0.

For binary tasks AUROC and AUPRC use the positive (second) class's probability, which is what their macro
one-vs-rest forms reduce to for AUROC; for AUPRC it is the standard binary average precision.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn import metrics as skm

GROUP_KEYS = ["dataset", "task", "encoder", "protocol", "seed", "regime", "split"]
METRIC_NAMES = ("accuracy", "balanced_accuracy", "auroc", "auprc", "f1_macro", "kappa", "ece", "ece_top_label")
N_BINS = 10


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


def positive_class_ece(y_true: np.ndarray, p_pos: np.ndarray, n_bins: int = N_BINS) -> float:
    """Binary ECE of the positive-class probability against the outcome y == 1 (FOCUS)."""
    return binned_calibration_error((np.asarray(y_true) == 1).astype(float), p_pos, n_bins)


def metric_names(n_classes: int) -> tuple[str, ...]:
    """Metrics reported for a task with ``n_classes`` classes (multi-class: no positive-class ``ece``)."""
    return METRIC_NAMES if n_classes == 2 else tuple(m for m in METRIC_NAMES if m != "ece")


def classification_metrics(y_true: np.ndarray, proba: np.ndarray, y_pred: np.ndarray, *,
                           ordinal: bool) -> dict[str, float]:
    """Metrics of one evaluated group: hard-decision metrics from ``y_pred`` (as written), the rest from
    ``proba``; keys :func:`metric_names`."""
    y_true = np.asarray(y_true)
    proba = np.asarray(proba, dtype=float)
    y_pred = np.asarray(y_pred)
    n_classes = proba.shape[1]
    labels = np.arange(n_classes)
    if y_pred.shape != y_true.shape:
        raise ValueError(f"y_pred has shape {y_pred.shape}, y_true {y_true.shape}")
    present = np.unique(y_true)
    out = {
        "accuracy": skm.accuracy_score(y_true, y_pred),
        "balanced_accuracy": skm.balanced_accuracy_score(y_true, y_pred),
        "f1_macro": skm.f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0),
        "kappa": skm.cohen_kappa_score(y_true, y_pred, labels=labels, weights="quadratic" if ordinal else None),
        "ece_top_label": expected_calibration_error(y_true, proba, N_BINS),
    }
    if n_classes == 2:
        out["ece"] = positive_class_ece(y_true, proba[:, 1], N_BINS)
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
    unknown = sorted(set(predictions["task"]) - set(tasks))
    if unknown:
        raise KeyError(f"predictions have task(s) {unknown} without a task registry entry (given {sorted(tasks)})")
    rows = []
    for key, grp in predictions.groupby(GROUP_KEYS, sort=True):
        task = tasks[key[1]]
        pcols = [f"p_{c}" for c in task["classes"]]
        missing = [c for c in pcols if c not in grp.columns]
        if missing:
            raise KeyError(f"predictions for task {key[1]} lack probability columns {missing}")
        where = ", ".join(f"{k} {v!r}" for k, v in zip(GROUP_KEYS, key))
        for col in ("y_true", "y_pred"):
            if grp[col].isna().any():
                raise ValueError(f"predictions ({where}): {int(grp[col].isna().sum())} rows without {col}")
            bad = sorted(set(grp[col].astype(int)) - set(range(len(pcols))))
            if bad:
                raise ValueError(f"predictions ({where}): {col} values {bad} are not class indices of the task's "
                                 f"{len(pcols)} classes {list(task['classes'])}")
        values = classification_metrics(grp["y_true"].to_numpy(dtype=int), grp[pcols].to_numpy(),
                                        grp["y_pred"].to_numpy(dtype=int), ordinal=task["ordinal"])
        base = dict(zip(GROUP_KEYS, key))
        for metric in metric_names(len(pcols)):
            rows.append({**base, "metric": metric, "value": values[metric], "n": len(grp)})
    return pd.DataFrame(rows)
