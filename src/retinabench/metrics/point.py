"""Point estimates, one function per metric: the one implementation every table of the benchmark computes a
metric with (the metrics table, the reliability layer, the baselines). Each takes the evaluated rows
(:class:`Scored`) and returns a float; the metric table (retinabench.metrics.table) names them.

Probability metrics (AUROC, AUPRC, ECE) read the ``p_<class>`` probabilities; hard-decision metrics the decisions
as written (``pred``). A decision may be the invalid-answer code :data:`INVALID_PRED` (an MLLM answer that is
neither class): it predicts no class, so it is wrong for accuracy, a miss of its true class, a false positive of
none, and stays in every denominator (TPR = TP / all positives, FPR = FP / all negatives) — what the weighted
bootstrap replicates (retinabench.metrics.weighted) compute too.

Binary tasks: the positive class is the second one (column 1). AUROC and AUPRC are scikit-learn's, on p_pos for
binary tasks and macro one-vs-rest over the classes present in ``y`` for multi-class tasks (a class absent from
``y`` has no curve). Undefined values are NaN: AUROC with one class present, binary AUPRC without positives.
scikit-learn is imported when a metric is computed, not with the table (the workflow's parse reads the table).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from retinabench.metrics.calibration import N_BINS, RIGHT_CLOSED, binary_ece, top_label_ece

INVALID_PRED = -1  # the invalid-answer code of generated-answer predictions


@dataclass(frozen=True, eq=False)
class Scored:
    """The evaluated rows of one group: true classes, probabilities (n × classes) and decisions. ``ordinal``:
    quadratic-weighted kappa; ``answered``: generated-answer predictions (kappa counts the invalid code as a
    category of its own)."""
    y: np.ndarray
    proba: np.ndarray
    pred: np.ndarray
    ordinal: bool = False
    answered: bool = False
    n_bins: int = N_BINS
    edges: str = RIGHT_CLOSED  # ECE bin edges (reliability.ece_bin_edges)

    @classmethod
    def of(cls, y, proba, pred, **kw) -> Scored:
        return cls(np.asarray(y, dtype=np.int64), np.asarray(proba, dtype=np.float64),
                   np.asarray(pred, dtype=np.int64), **kw)

    @property
    def n_classes(self) -> int:
        return self.proba.shape[1]

    @cached_property
    def present(self) -> np.ndarray:
        """The classes present in ``y``, ascending."""
        return np.unique(self.y)

    @cached_property
    def confusion(self) -> np.ndarray:
        """Confusion counts, rows = true classes, columns = the classes then the invalid code (one per group:
        scikit-learn's input checks dominate the cost of the small groups of the subgroup analyses)."""
        from sklearn.metrics import confusion_matrix
        return confusion_matrix(self.y, self.pred, labels=[*range(self.n_classes), INVALID_PRED])[:-1]


def _nan() -> float:
    return float("nan")


def accuracy(s: Scored) -> float:
    return np.trace(s.confusion) / len(s.y) if len(s.y) else _nan()


def balanced_accuracy(s: Scored) -> float:
    """Mean recall over the classes present (= scikit-learn's balanced_accuracy_score; an invalid decision is a
    miss of its true class)."""
    counts = np.bincount(s.y, minlength=s.n_classes)
    return float(np.mean(np.diag(s.confusion)[s.present] / counts[s.present]))


def _binary_counts(s: Scored) -> tuple[int, int, int, int]:
    cm = s.confusion
    tp, fp = cm[1, 1], cm[0, 1]
    return tp, fp, cm[1].sum() - tp, cm[0].sum() - fp  # tp, fp, fn, tn


def f1(s: Scored) -> float:
    """F1 of the positive class (= scikit-learn's f1_score with zero_division=0, which refuses the invalid code as
    a third label)."""
    tp, fp, fn, _ = _binary_counts(s)
    return 2 * tp / (2 * tp + fp + fn) if 2 * tp + fp + fn else 0.0


def f1_macro(s: Scored) -> float:
    from sklearn.metrics import f1_score
    return f1_score(s.y, s.pred, labels=np.arange(s.n_classes), average="macro", zero_division=0)


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


def kappa(s: Scored) -> float:
    """Cohen's kappa, quadratic weights for ordinal tasks (generated answers: :func:`kappa_with_invalid`)."""
    if s.answered:
        return kappa_with_invalid(s.y, s.pred, s.n_classes, ordinal=s.ordinal)
    from sklearn.metrics import cohen_kappa_score
    return cohen_kappa_score(s.y, s.pred, labels=np.arange(s.n_classes), weights="quadratic" if s.ordinal else None)


def _ranking(s: Scored, score) -> float:
    """A ranking metric: on p_pos for binary tasks; macro one-vs-rest over the classes present otherwise."""
    if s.n_classes == 2:
        return score(s.y, s.proba[:, 1])
    if len(s.present) < 2:
        return _nan()
    onehot = np.eye(s.n_classes)[s.y]
    return score(onehot[:, s.present], s.proba[:, s.present], average="macro")


def auroc(s: Scored) -> float:
    """AUROC (``auroc``, and ``auroc_macro``: its name for multi-class tasks in the reliability tables)."""
    from sklearn.metrics import roc_auc_score
    return _ranking(s, roc_auc_score) if len(s.present) >= 2 else _nan()


def auprc(s: Scored) -> float:
    """AUPRC = average precision (``auprc``, and ``auprc_macro``); binary: NaN without positives."""
    from sklearn.metrics import average_precision_score
    if s.n_classes == 2 and 1 not in s.present:
        return _nan()
    return _ranking(s, average_precision_score)


def ece(s: Scored) -> float:
    return binary_ece(s.y, s.proba[:, 1], s.n_bins, s.edges)


def ece_top_label(s: Scored) -> float:
    return top_label_ece(s.y, s.proba, s.n_bins, s.edges)


def ppr(s: Scored) -> float:
    return float(np.mean(s.pred == 1))


def tpr(s: Scored) -> float:
    tp, _, fn, _ = _binary_counts(s)
    return tp / (tp + fn) if tp + fn else _nan()


def fpr(s: Scored) -> float:
    _, fp, _, tn = _binary_counts(s)
    return fp / (fp + tn) if fp + tn else _nan()


def _per_class_rates(s: Scored, rate: str) -> float:
    cm = s.confusion
    vals = []
    for c in range(s.n_classes):
        tp = cm[c, c]
        fn = cm[c].sum() - tp
        fp = cm[:, c].sum() - tp
        tn = cm.sum() - tp - fn - fp
        if rate == "tpr" and tp + fn:
            vals.append(tp / (tp + fn))
        elif rate == "fpr" and fp + tn:
            vals.append(fp / (fp + tn))
    return float(np.mean(vals)) if vals else _nan()


def tpr_macro(s: Scored) -> float:
    """Macro TPR (recall) over the classes present."""
    return _per_class_rates(s, "tpr")


def fpr_macro(s: Scored) -> float:
    """Macro FPR over the classes with negatives."""
    return _per_class_rates(s, "fpr")


def invalid_rate(s: Scored) -> float:
    return float((s.pred == INVALID_PRED).mean()) if len(s.y) else _nan()


def accuracy_valid(s: Scored) -> float:
    """Accuracy over the valid answers (NaN without any)."""
    valid = s.pred != INVALID_PRED
    return float((s.pred == s.y)[valid].mean()) if valid.any() else _nan()
