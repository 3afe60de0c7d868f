"""Generated-answer predictions (MLLM): hard decisions from y_pred as written, an invalid answer (y_pred = -1)
counted wrong by every hard metric, invalid_rate and the valid-only accuracy (with its n) in the metrics table."""
import numpy as np
import pandas as pd
import pytest
from sklearn import metrics as skm

from retinabench.metrics.classification import INVALID_PRED, classification_metrics, kappa_with_invalid, metrics_table

Y = np.array([1, 1, 0, 0, 1, 0])
PRED = np.array([1, INVALID_PRED, 0, 1, INVALID_PRED, 0])
PROBA = np.c_[1 - np.array([0.9, 0.4, 0.2, 0.6, 0.5, 0.1]), [0.9, 0.4, 0.2, 0.6, 0.5, 0.1]]


def test_invalid_answers_count_as_wrong():
    m = classification_metrics(Y, PROBA, PRED, ordinal=False, answered=True)
    assert m["accuracy"] == pytest.approx(3 / 6)              # not 3 / 4: the invalid rows are not dropped
    assert m["invalid_rate"] == pytest.approx(2 / 6)
    assert m["accuracy_valid"] == pytest.approx(3 / 4) and m["n_valid"] == 4
    assert m["balanced_accuracy"] == pytest.approx((1 / 3 + 2 / 3) / 2)  # recall of class 1: 1 of 3
    # class 1: TP 1, FP 1, FN 2 -> F1 0.4; class 0: TP 2, FP 0, FN 1 -> F1 0.8
    assert m["f1_macro"] == pytest.approx((0.4 + 0.8) / 2)
    # kappa: the invalid answer is a category of its own (nominal: what sklearn gives with it as a third label)
    assert m["kappa"] == pytest.approx(skm.cohen_kappa_score(Y, np.where(PRED < 0, 2, PRED)))
    # threshold-free metrics use the scores, whatever the text said
    assert m["auroc"] == pytest.approx(skm.roc_auc_score(Y, PROBA[:, 1]))


def test_without_invalid_answers_the_metrics_equal_the_argmax_ones():
    pred = PROBA.argmax(1)
    a = classification_metrics(Y, PROBA, pred, ordinal=False)
    b = classification_metrics(Y, PROBA, pred, ordinal=False, answered=True)
    for k in a:
        assert b[k] == pytest.approx(a[k]), k
    assert b["invalid_rate"] == 0.0 and b["accuracy_valid"] == pytest.approx(a["accuracy"])
    y3, p3 = np.array([0, 1, 2, 2, 1, 0, 2]), np.array([0, 2, 2, 1, 1, 0, 0])
    assert kappa_with_invalid(y3, p3, 3, ordinal=True) == pytest.approx(
        skm.cohen_kappa_score(y3, p3, weights="quadratic"))
    assert kappa_with_invalid(y3, p3, 3, ordinal=False) == pytest.approx(skm.cohen_kappa_score(y3, p3))
    # an invalid answer on an ordinal task weighs as much as the worst disagreement
    worse = p3.copy()
    worse[1] = INVALID_PRED
    assert kappa_with_invalid(y3, worse, 3, ordinal=True) < kappa_with_invalid(y3, p3, 3, ordinal=True)


def test_bad_prediction_codes_are_errors():
    with pytest.raises(ValueError, match=r"y_pred values \[5\]"):
        classification_metrics(Y, PROBA, np.array([5, 0, 0, 0, 0, 0]), ordinal=False, answered=True)


def _preds(answered: bool):
    df = pd.DataFrame({"image_id": [f"i{k}" for k in range(6)], "dataset": "d", "task": "t", "encoder": "m",
                       "protocol": "mllm", "seed": 0, "regime": "u-u", "split": "test", "y_true": Y,
                       "y_pred": PRED if answered else PROBA.argmax(1), "p_no": PROBA[:, 0], "p_yes": PROBA[:, 1]})
    if answered:
        df["answer"] = ["Yes.", "I cannot tell", "no", "yes,", "", "No"]
    return df


def test_metrics_table_adds_invalid_rate_and_valid_only_accuracy_for_answers():
    task = {"t": {"name": "t", "classes": ["no", "yes"], "ordinal": False}}
    m = metrics_table(_preds(True), task).set_index("metric")
    assert m.loc["invalid_rate", "value"] == pytest.approx(2 / 6) and m.loc["invalid_rate", "n"] == 6
    assert m.loc["accuracy_valid", "value"] == pytest.approx(3 / 4) and m.loc["accuracy_valid", "n"] == 4
    assert m.loc["accuracy", "value"] == pytest.approx(0.5) and m.loc["accuracy", "n"] == 6
    plain = metrics_table(_preds(False), task)  # frozen-style predictions: unchanged metric set
    assert "invalid_rate" not in set(plain["metric"])
    # a table concatenated from both kinds: the others' rows have an empty answer column and no answer metrics
    both = metrics_table(pd.concat([_preds(True), _preds(False).assign(protocol="linear")]), task)
    assert set(both[both["metric"] == "invalid_rate"]["protocol"]) == {"mllm"}
    leaked = _preds(False)
    leaked.loc[0, "y_pred"] = INVALID_PRED  # the invalid code is only for generated answers
    with pytest.raises(ValueError, match=r"y_pred values \[-1\]"):
        metrics_table(leaked, task)


def test_reliability_point_metrics_count_invalid_answers_like_the_bootstrap():
    """thresholds.point_metrics (reliability point estimates) and the weighted bootstrap agree on invalid
    decisions: wrong for accuracy, a false negative of a positive, in every denominator."""
    from retinabench.metrics.thresholds import point_metrics
    from retinabench.metrics.weighted import weighted_metrics
    names = ("accuracy", "f1", "tpr", "fpr", "ppr", "auroc", "ece")
    pt = point_metrics(names, Y, PROBA, PRED)
    boot = weighted_metrics(names, Y, PROBA, PRED, np.ones((1, len(Y))))
    for name in names:
        assert pt[name] == pytest.approx(boot[name][0]), name
    assert pt["accuracy"] == pytest.approx(3 / 6)
    assert pt["tpr"] == pytest.approx(1 / 3)        # positives: yes, invalid, invalid
    assert pt["fpr"] == pytest.approx(1 / 3)        # negatives: no, yes, no
    assert pt["f1"] == pytest.approx(2 * 1 / (2 * 1 + 1 + 2))
    # without invalid decisions: scikit-learn's values
    pred = PROBA.argmax(1)
    plain = point_metrics(("f1", "tpr"), Y, PROBA, pred)
    assert plain["f1"] == pytest.approx(skm.f1_score(Y, pred)) and plain["tpr"] == pytest.approx(skm.recall_score(Y, pred))
    y3, p3 = np.array([0, 1, 2, 2, 1, 0, 2]), np.array([0, 2, -1, 1, 1, -1, 0])
    proba3 = np.full((7, 3), 1 / 3)
    pm = point_metrics(("accuracy", "f1_macro", "tpr_macro"), y3, proba3, p3)
    bm = weighted_metrics(("accuracy", "f1_macro", "tpr_macro"), y3, proba3, p3, np.ones((1, 7)))
    for name in pm:
        assert pm[name] == pytest.approx(bm[name][0]), name
