"""Decision thresholds and the metrics that depend on them.

Rules: the protocol's own decision ``y_pred`` as written in the predictions (never recomputed: the argmax, FOCUS's
rule, for every probe and fine-tuning; a parsed answer for an MLLM; applied in retinabench.reliability) and a
validation-chosen threshold on the positive-class probability, ``youden`` (max TPR − FPR) or ``f1`` (max F1). A
chosen threshold is fixed on the validation rows of the model's own training dataset and carried unchanged to its
test rows and to every other dataset it is evaluated on. Multi-class tasks use ``y_pred`` only. :func:`predict`
also knows ``argmax`` (the most probable class; binary: p_pos > 0.5, ties to the negative class).

Point metrics come from scikit-learn (binary: AUROC, AUPRC = average precision, accuracy, F1 of the positive
class, ``ece`` on the positive-class probability and ``ece_top_label``; multi-class: macro one-vs-rest AUROC/AUPRC
over classes present, accuracy, macro F1, ``ece_top_label``; both: TPR/FPR (macro for multi-class), predicted-positive rate for binary).
"""
from __future__ import annotations

import numpy as np
from sklearn import metrics as skm

from retinabench.metrics.calibration import binary_ece, top_label_ece
from retinabench.metrics.weighted import BINARY_METRICS, MULTICLASS_METRICS

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
    return BINARY_METRICS if n_classes == 2 else MULTICLASS_METRICS


THRESHOLD_FREE = {"auroc", "auprc", "ece", "auroc_macro", "auprc_macro", "ece_top_label"}


def base_metric(name: str) -> str:
    """Metric family of a name: auroc_macro -> auroc, ece_top_label -> ece (for BH families and scores)."""
    return name.removesuffix("_macro").removesuffix("_top_label")


def point_metrics(names, y_true, proba, pred, *, n_bins: int = 10) -> dict[str, float]:
    """scikit-learn point estimates of ``names`` (see the module docstring); undefined values are NaN."""
    y = np.asarray(y_true, dtype=np.int64)
    proba = np.asarray(proba, dtype=np.float64)
    pred = np.asarray(pred, dtype=np.int64)
    k = proba.shape[1]
    labels = np.arange(k)
    present = np.unique(y)
    out: dict[str, float] = {}
    cms: dict[str, np.ndarray] = {}  # one confusion matrix per call (sklearn's input checks dominate the cost)

    def confusion(binary: bool) -> np.ndarray:
        key = "binary" if binary else "all"
        if key not in cms:
            cms[key] = skm.confusion_matrix(y, pred, labels=[0, 1] if binary else labels)
        return cms[key]

    for name in names:
        if name not in metric_names(k):
            raise KeyError(f"metric {name!r} is not defined for {'binary' if k == 2 else f'{k}-class'} tasks")
        if len(y) == 0:
            out[name] = float("nan")
        elif name == "accuracy":
            out[name] = np.trace(confusion(k == 2)) / len(y)  # = skm.accuracy_score (labels cover all classes)
        elif name == "auroc":
            out[name] = skm.roc_auc_score(y, proba[:, 1]) if len(present) == 2 else float("nan")
        elif name == "auprc":
            out[name] = skm.average_precision_score(y, proba[:, 1]) if 1 in present else float("nan")
        elif name in ("auroc_macro", "auprc_macro"):
            if len(present) < 2:
                out[name] = float("nan")
                continue
            onehot = np.eye(k)[y]
            fn = skm.roc_auc_score if name == "auroc_macro" else skm.average_precision_score
            out[name] = fn(onehot[:, present], proba[:, present], average="macro")
        elif name == "f1":
            out[name] = skm.f1_score(y, pred, pos_label=1, average="binary", zero_division=0)
        elif name == "f1_macro":
            out[name] = skm.f1_score(y, pred, labels=labels, average="macro", zero_division=0)
        elif name == "ece":
            out[name] = binary_ece(y, proba[:, 1], n_bins)
        elif name == "ece_top_label":
            out[name] = top_label_ece(y, proba, n_bins)
        elif name == "ppr":
            out[name] = float(np.mean(pred == 1))
        elif name in ("tpr", "fpr"):
            (tn, fp), (fn, tp) = confusion(True)
            den = tp + fn if name == "tpr" else fp + tn
            out[name] = (tp if name == "tpr" else fp) / den if den else float("nan")
        elif name in ("tpr_macro", "fpr_macro"):
            cm = confusion(False)
            vals = []
            for c in labels:
                tp = cm[c, c]
                fn = cm[c].sum() - tp
                fp = cm[:, c].sum() - tp
                tn = cm.sum() - tp - fn - fp
                if name == "tpr_macro" and tp + fn:
                    vals.append(tp / (tp + fn))
                elif name == "fpr_macro" and fp + tn:
                    vals.append(fp / (fp + tn))
            out[name] = float(np.mean(vals)) if vals else float("nan")
    return {k_: float(v) for k_, v in out.items()}
