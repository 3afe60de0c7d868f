"""Decision thresholds and the metrics that depend on them.

Rules: the protocol's own decision ``y_pred`` as written in the predictions (never recomputed: the argmax, FOCUS's
rule, for every probe and fine-tuning; a parsed answer for an MLLM; applied in retinabench.reliability) and a
validation-chosen threshold on the positive-class probability, ``youden`` (max TPR − FPR) or ``f1`` (max F1). A
chosen threshold is fixed on the validation rows of the model's own training dataset and carried unchanged to its
test rows and to every other dataset it is evaluated on. Multi-class tasks use ``y_pred`` only. :func:`predict`
also knows ``argmax`` (the most probable class; binary: p_pos > 0.5, ties to the negative class).

Point metrics (:func:`point_metrics`) have the reliability tables' names (the metric table's
``RELIABILITY_BINARY`` / ``RELIABILITY_MULTICLASS``), each computed by its function in retinabench.metrics.point (binary: AUROC, AUPRC = average precision, accuracy, F1 of the positive
class, ``ece`` on the positive-class probability and ``ece_top_label``; multi-class: macro one-vs-rest AUROC/AUPRC
over classes present, accuracy, macro F1, ``ece_top_label``; both: TPR/FPR (macro for multi-class), predicted-positive rate for binary).

A decision may be the invalid-answer code -1 (an MLLM answer that is neither yes nor no; see
retinabench.metrics.classification): it predicts no class, so it is wrong for accuracy, a false negative of its
true class, a false positive of none, and stays in every denominator (TPR = TP / all positives, FPR = FP / all
negatives) — what the weighted bootstrap replicates compute too.
"""
from __future__ import annotations

import numpy as np
from sklearn import metrics as skm

from retinabench.metrics.point import Scored
from retinabench.metrics.table import metric, reliability_names, threshold_free

THRESHOLD_RULES = ("youden", "f1")
DEFAULT_THRESHOLD = 0.5


def choose_threshold(y_true, p_pos, rule: str) -> tuple[float, str]:
    """Threshold on p_pos maximising the rule on (y_true, p_pos); predictions are ``p_pos >= threshold``.

    Returns (threshold, note). Ties go to the highest threshold (the most conservative). When the rule is
    undefined (one class only) or no threshold beats predicting everything negative, 0.5 is used and the note
    says why.
    """
    if rule not in THRESHOLD_RULES:
        raise ValueError(f"unknown threshold rule {rule!r}; expected one of {THRESHOLD_RULES}")
    y = np.asarray(y_true).astype(int)
    p = np.asarray(p_pos, dtype=np.float64)
    if len(y) == 0:
        return DEFAULT_THRESHOLD, "no validation rows: 0.5 used"
    if len(np.unique(y)) < 2:
        return DEFAULT_THRESHOLD, f"validation rows have one class only ({int(y[0])}): 0.5 used"
    if rule == "youden":
        fpr, tpr, thr = skm.roc_curve(y, p, drop_intermediate=False)
        j = tpr - fpr
        idx = int(np.argmax(j))  # roc_curve lists thresholds in decreasing order: first max = highest threshold
        if not np.isfinite(thr[idx]) or j[idx] <= 0:
            return DEFAULT_THRESHOLD, "no threshold with Youden J > 0: 0.5 used"
        return float(thr[idx]), ""
    prec, rec, thr = skm.precision_recall_curve(y, p)
    prec, rec = prec[:-1], rec[:-1]  # the last point (recall 0, precision 1) has no threshold
    with np.errstate(invalid="ignore", divide="ignore"):
        f1 = np.where(prec + rec > 0, 2 * prec * rec / (prec + rec), 0.0)
    best = f1.max()
    idx = int(np.flatnonzero(f1 == best).max())  # thresholds increase along the curve: last max = highest
    return float(thr[idx]), ""


def predict(proba: np.ndarray, rule: str, threshold: float | None = None) -> np.ndarray:
    """Class predictions under a rule: argmax, or ``p_pos >= threshold`` for a threshold rule (binary only)."""
    proba = np.asarray(proba, dtype=np.float64)
    if rule == "argmax":
        return proba.argmax(axis=1).astype(np.int64)
    if proba.shape[1] != 2:
        raise ValueError(f"threshold rule {rule!r} needs a binary task, got {proba.shape[1]} classes")
    if threshold is None:
        raise ValueError(f"threshold rule {rule!r} needs a threshold")
    return (proba[:, 1] >= threshold).astype(np.int64)


def metric_names(n_classes: int) -> tuple[str, ...]:
    return reliability_names(n_classes)


THRESHOLD_FREE = threshold_free()


def point_metrics(names, y_true, proba, pred, *, n_bins: int = 10, edges: str = "right_closed") -> dict[str, float]:
    """Point estimates of ``names`` (see the module docstring and retinabench.metrics.point); undefined values
    are NaN, every value NaN without rows."""
    scored = Scored.of(y_true, proba, pred, n_bins=n_bins, edges=edges)
    k = scored.n_classes
    out: dict[str, float] = {}
    for name in names:
        if name not in metric_names(k):
            raise KeyError(f"metric {name!r} is not defined for {'binary' if k == 2 else f'{k}-class'} tasks")
        out[name] = float(metric(name).point(scored)) if len(scored.y) else float("nan")
    return out
