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

Predictions that carry a generated ``answer`` (the MLLM protocols) may hold invalid answers: ``y_pred = -1``
(:data:`INVALID_PRED`), kept, never dropped. An invalid answer counts as wrong in every hard-decision metric:
accuracy, balanced accuracy (a miss of its true class), macro F1 (a false negative of its true class, a false
positive of none) and kappa (a category of its own that agrees with no class; weight 1 = maximal disagreement
against every class). Such tables also get ``invalid_rate`` (n = all rows) and ``accuracy_valid`` (accuracy over
the valid answers; n = their count). A table without an ``answer`` column may not hold the invalid code.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn import metrics as skm

GROUP_KEYS = ["dataset", "task", "encoder", "protocol", "seed", "regime", "split"]
METRIC_NAMES = ("accuracy", "balanced_accuracy", "auroc", "auprc", "f1_macro", "kappa", "ece", "ece_top_label")
N_BINS = 10
# Generated-answer predictions (an ``answer`` column): the invalid-answer code and the metrics they add.
INVALID_PRED = -1
ANSWER_METRIC_NAMES = ("invalid_rate", "accuracy_valid")


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


def kappa_with_invalid(y_true: np.ndarray, y_pred: np.ndarray, n_classes: int, *, ordinal: bool) -> float:
    """Cohen's kappa (quadratic weights for ordinal tasks) with invalid predictions (``INVALID_PRED``) as an
    extra category whose disagreement weight with every class is 1 (the maximum); equals sklearn's
    ``cohen_kappa_score`` when nothing is invalid."""
    k = n_classes + 1  # last category: invalid
    cat_pred = np.where(y_pred == INVALID_PRED, n_classes, y_pred)
    observed = np.zeros((k, k))
    np.add.at(observed, (np.asarray(y_true), cat_pred), 1.0)
    idx = np.arange(k)
    if ordinal:
        w = ((idx[:, None] - idx[None, :]) / max(1, n_classes - 1)) ** 2
    else:
        w = (idx[:, None] != idx[None, :]).astype(float)
    w[n_classes, :] = w[:, n_classes] = 1.0
    w[n_classes, n_classes] = 0.0
    expected = np.outer(observed.sum(1), observed.sum(0)) / observed.sum()
    denom = (w * expected).sum()
    return float(1.0 - (w * observed).sum() / denom) if denom > 0 else float("nan")


def metric_names(n_classes: int) -> tuple[str, ...]:
    """Metrics reported for a task with ``n_classes`` classes (multi-class: no positive-class ``ece``)."""
    return METRIC_NAMES if n_classes == 2 else tuple(m for m in METRIC_NAMES if m != "ece")


def classification_metrics(y_true: np.ndarray, proba: np.ndarray, y_pred: np.ndarray, *,
                           ordinal: bool, answered: bool = False) -> dict[str, float]:
    """Metrics of one evaluated group: hard-decision metrics from ``y_pred`` (as written), the rest from
    ``proba``; keys :func:`metric_names`. ``answered``: generated-answer predictions, ``y_pred`` may hold
    ``INVALID_PRED``; the result also holds ``invalid_rate``, ``accuracy_valid`` and ``n_valid``."""
    y_true = np.asarray(y_true)
    proba = np.asarray(proba, dtype=float)
    y_pred = np.asarray(y_pred)
    n_classes = proba.shape[1]
    labels = np.arange(n_classes)
    if y_pred.shape != y_true.shape:
        raise ValueError(f"y_pred has shape {y_pred.shape}, y_true {y_true.shape}")
    present = np.unique(y_true)
    if not answered:
        out = {
            "accuracy": skm.accuracy_score(y_true, y_pred),
            "balanced_accuracy": skm.balanced_accuracy_score(y_true, y_pred),
            "f1_macro": skm.f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0),
            "kappa": skm.cohen_kappa_score(y_true, y_pred, labels=labels,
                                           weights="quadratic" if ordinal else None),
        }
    else:
        y_pred = y_pred.astype(np.int64)
        bad = sorted(set(np.unique(y_pred).tolist()) - set(labels.tolist()) - {INVALID_PRED})
        if bad:
            raise ValueError(f"y_pred values {bad} are neither a class index (0..{n_classes - 1}) nor the "
                             f"invalid-answer code {INVALID_PRED}")
        valid = y_pred != INVALID_PRED
        correct = y_pred == y_true
        out = {
            "accuracy": float(correct.mean()) if len(y_true) else float("nan"),
            # recall of each present class, invalid answers being misses of their true class
            "balanced_accuracy": float(np.mean([correct[y_true == c].mean() for c in present])),
            # labels exclude the invalid code: an invalid answer is a false negative of its true class only
            "f1_macro": skm.f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0),
            "kappa": kappa_with_invalid(y_true, y_pred, n_classes, ordinal=ordinal),
            "invalid_rate": float((~valid).mean()) if len(y_true) else float("nan"),
            "accuracy_valid": float(correct[valid].mean()) if valid.any() else float("nan"),
            "n_valid": int(valid.sum()),
        }
    out["ece_top_label"] = expected_calibration_error(y_true, proba, N_BINS)
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
    return {k: (v if k == "n_valid" else float(v)) for k, v in out.items()}


def has_answers(predictions: pd.DataFrame) -> bool:
    """Rows of generated-answer predictions: an ``answer`` column with values (a table concatenated from several
    protocols has the column, empty, on the rows of the others)."""
    return "answer" in predictions.columns and bool(predictions["answer"].notna().any())


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
        answered = has_answers(grp)  # generated answers: hard decisions as written, invalid = -1
        for col in ("y_true", "y_pred"):
            if grp[col].isna().any():
                raise ValueError(f"predictions ({where}): {int(grp[col].isna().sum())} rows without {col}")
            allowed = set(range(len(pcols))) | ({INVALID_PRED} if answered and col == "y_pred" else set())
            bad = sorted(set(grp[col].astype(int)) - allowed)
            if bad:
                raise ValueError(f"predictions ({where}): {col} values {bad} are not class indices of the task's "
                                 f"{len(pcols)} classes {list(task['classes'])}")
        values = classification_metrics(grp["y_true"].to_numpy(dtype=int), grp[pcols].to_numpy(),
                                        grp["y_pred"].to_numpy(dtype=int), ordinal=task["ordinal"],
                                        answered=answered)
        base = dict(zip(GROUP_KEYS, key))
        for metric in metric_names(len(pcols)):
            rows.append({**base, "metric": metric, "value": values[metric], "n": len(grp)})
        if answered:
            rows.append({**base, "metric": "invalid_rate", "value": values["invalid_rate"], "n": len(grp)})
            rows.append({**base, "metric": "accuracy_valid", "value": values["accuracy_valid"],
                         "n": values["n_valid"]})
    return pd.DataFrame(rows)
