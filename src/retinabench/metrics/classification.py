"""Classification metrics from predictions: accuracy, balanced accuracy, macro AUROC (one-vs-rest), macro AUPRC
(average precision), macro F1, Cohen's kappa (quadratic for ordinal tasks) and calibration error.

Hard-decision metrics (accuracy, balanced accuracy, F1, kappa) come from the ``y_pred`` each protocol wrote, as
written: a protocol whose decision is not the argmax of its probabilities (a parsed MLLM answer, a validation-chosen
threshold) is scored on its own decision. Probability metrics (AUROC, AUPRC, ECE) come from the ``p_<class>``
columns. Each metric is computed by its one function (retinabench.metrics.point), named in the metric table
(retinabench.metrics.table), which also says which metrics this table reports (``METRICS_TABLE``).

ECE vocabulary (the same in every table of the benchmark): ``ece`` is the positive-class ECE of binary tasks (the
binned gap between P(y = positive) and p_pos; FOCUS), ``ece_top_label`` the top-label ECE (top-label accuracy vs
top-label confidence). Binary tasks report both, multi-class tasks ``ece_top_label`` only. Both use 10 equal-width
bins, bin i holding (i/10, (i+1)/10] and 0 going to bin 0 (this table always: ``reliability.ece_bin_edges`` and
``n_bins`` apply to the reliability layer's tables).

For binary tasks AUROC and AUPRC use the positive (second) class's probability, which is what their macro
one-vs-rest forms reduce to for AUROC; for AUPRC it is the standard binary average precision.

Predictions that carry a generated ``answer`` (the MLLM protocols) may hold invalid answers: ``y_pred = -1``
(:data:`INVALID_PRED`), kept, never dropped. An invalid answer counts as wrong in every hard-decision metric:
accuracy, balanced accuracy (a miss of its true class), macro F1 (a false negative of its true class, a false
positive of none) and kappa (a category of its own that agrees with no class; weight 1 = maximal disagreement
against every class). Such tables also get ``invalid_rate`` (n = all rows) and ``accuracy_valid`` (accuracy over
the valid answers; n = their count). A table without an ``answer`` column may not hold the invalid code. Under
``mllm.invalid_answers: drop`` (FOCUS) the invalid answers are not in the table; its rows' ``n_answers`` and
``n_dropped`` columns then give ``invalid_rate`` (n = the answers given) while the other metrics cover the valid
answers.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from retinabench.metrics.calibration import N_BINS  # noqa: F401 (re-exported)
from retinabench.metrics.point import INVALID_PRED, Scored, kappa_with_invalid  # noqa: F401 (re-exported)
from retinabench.metrics.table import ANSWER_METRICS as ANSWER_METRIC_NAMES  # noqa: F401 (re-exported)
from retinabench.metrics.table import METRICS_TABLE as METRIC_NAMES  # noqa: F401 (re-exported)
from retinabench.metrics.table import METRICS, metrics_table_names

GROUP_KEYS = ["dataset", "task", "encoder", "protocol", "seed", "regime", "split"]


def metric_names(n_classes: int) -> tuple[str, ...]:
    """Metrics reported for a task with ``n_classes`` classes (multi-class: no positive-class ``ece``)."""
    return metrics_table_names(n_classes)


def classification_metrics(y_true: np.ndarray, proba: np.ndarray, y_pred: np.ndarray, *,
                           ordinal: bool, answered: bool = False) -> dict[str, float]:
    """Metrics of one evaluated group: hard-decision metrics from ``y_pred`` (as written), the rest from
    ``proba``; keys :func:`metric_names`. ``answered``: generated-answer predictions, ``y_pred`` may hold
    ``INVALID_PRED``; the result also holds ``invalid_rate``, ``accuracy_valid`` and ``n_valid``."""
    scored = Scored.of(y_true, proba, y_pred, ordinal=ordinal, answered=answered)
    n_classes = scored.n_classes
    if np.shape(y_pred) != np.shape(y_true):
        raise ValueError(f"y_pred has shape {np.shape(y_pred)}, y_true {np.shape(y_true)}")
    if answered:
        bad = sorted(set(np.unique(scored.pred).tolist()) - set(range(n_classes)) - {INVALID_PRED})
        if bad:
            raise ValueError(f"y_pred values {bad} are neither a class index (0..{n_classes - 1}) nor the "
                             f"invalid-answer code {INVALID_PRED}")
    names = [*metric_names(n_classes), *(ANSWER_METRIC_NAMES if answered else ())]
    out = {name: float(METRICS[name].point(scored)) for name in names}
    if len(scored.present) < 2:  # ranking metrics are undefined with one class present
        out["auroc"] = out["auprc"] = float("nan")
    if answered:
        out["n_valid"] = int((scored.pred != INVALID_PRED).sum())
    return out


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
            n_answers, rate = len(grp), values["invalid_rate"]
            if "n_dropped" in grp.columns and grp["n_dropped"].notna().any():  # invalid answers dropped (FOCUS)
                n_answers = int(grp["n_answers"].iloc[0])
                rate = (rate * len(grp) + float(grp["n_dropped"].iloc[0])) / n_answers
            rows.append({**base, "metric": "invalid_rate", "value": rate, "n": n_answers})
            rows.append({**base, "metric": "accuracy_valid", "value": values["accuracy_valid"],
                         "n": values["n_valid"]})
    return pd.DataFrame(rows)
